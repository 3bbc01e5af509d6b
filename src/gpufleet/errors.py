class InputError(ValueError):
    """Bad input (file, option, inventory variable). The message names it and what was expected."""

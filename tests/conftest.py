"""Shared test set-up."""

# The module tests import ansible.module_utils.basic in this process, which replaces sys.intern;
# torch._dynamo (imported later by transformers, peft and torch.compile) refuses to load after that.
# Importing it first keeps the test order from mattering.
try:
    import torch._dynamo  # noqa: F401
except ImportError:  # no torch: the tests that need it skip
    pass

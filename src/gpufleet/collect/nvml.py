def read():
    return {}

def read(root="/"):
    return {}

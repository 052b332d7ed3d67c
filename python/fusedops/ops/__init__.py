"""One module per operator family; each registers its torch.library custom ops on import."""

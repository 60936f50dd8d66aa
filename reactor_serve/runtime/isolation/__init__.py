"""Process isolation: the model's child process, its worker, the channel between them, the shared-memory frame ring and the output forwarded across it."""

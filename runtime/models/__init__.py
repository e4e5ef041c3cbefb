"""Model transports: the seam (`base`), the keyless scripted model, the OpenAI-compatible client."""

"""Export: final models in Hugging Face format (safetensors), free of training-only parts."""

"""The vision encoders of the multimodal families (Gemma 3, Gemma 4, Qwen3.5): each turns a
list of ImageInput (engine/multimodal) into the rows that replace the images' placeholder
embeddings in the text model. Built from the checkpoint's config.json, loaded from its
vision-tower and projector weights, run on our Linear (quantizable) and attention paths."""

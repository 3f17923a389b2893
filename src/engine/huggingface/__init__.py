"""Hugging Face transformers, in one corner: its own `generate` as a trial's loop (library_loop), a
checkpoint from a folder run by the tool's loops (folder_model), and the tool's model as a
transformers checkpoint (checkpoint)."""

"""The bytes of weight sync: tensor specs, bucket plans, the broadcast group, the safetensors codec,
chunk streams, deltas, checkpoint files and the in-place loader."""

"""Many devices through torchrun: DDP and FSDP2, sharded checkpoints, the data order split across ranks."""

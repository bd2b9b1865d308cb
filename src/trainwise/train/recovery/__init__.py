"""Keeping a run alive or resumable: checkpoints, clean stops on signals, out-of-memory recovery."""

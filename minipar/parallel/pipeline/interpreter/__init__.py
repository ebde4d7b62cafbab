"""The interpreter that runs one rank's schedule on real tensors and real messages."""

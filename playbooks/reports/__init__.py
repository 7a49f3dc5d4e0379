"""What a server did over a window, computed from what is stored."""

"""What several test modules share: cell classes, nodes and fleets to run them, fake nodes,
stores and peers, and small waits and readings. Tests import from here, never from one
another."""

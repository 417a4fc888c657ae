"""The memory methods' fan-out tree (`synchronizer.fanout` > 0): the tree plan, each explorer's relay
(store, gRPC server, version notices) and the explorer's fetch through it."""

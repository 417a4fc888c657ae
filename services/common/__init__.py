"""Shared kit of every service: config tree, Experience record and codec, gRPC server/client kit, logging, monitors, registry, model loading."""

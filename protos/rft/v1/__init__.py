"""Generated gRPC contracts of RFT Mesh (package rft.v1). Do not edit: run scripts/gen_protos.py."""

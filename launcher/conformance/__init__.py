"""Black-box contract suites: each guarantee a `.proto` states, checked over gRPC against any address.

`rft conformance buffer ADDRESS [--auth-token T] [--group G]` runs the buffer suite
(`launcher.conformance.buffer`): one named check per guarantee of `protos/rft/v1/buffer.proto`, each
printing PASS, FAIL or SKIP with a one-line reason. The suite speaks only gRPC (the generated `rft.v1`
stubs and the channel factory of `services.common.rpc`), never imports a service, so it judges any
implementation of the contract, in any language. Suites for the synchronizer's and the explorer's public
calls are still to come.
"""

"""Black-box contract suites: each guarantee a `.proto` states, checked over gRPC against any address.

`rft conformance buffer|synchronizer|explorer ADDRESS [--auth-token T]` runs the suite of that service
(`launcher.conformance.buffer`, `.synchronizer`, `.explorer`): one named check per guarantee of its
`protos/rft/v1/*.proto`, each printing PASS, FAIL or SKIP with a one-line reason. The suites speak only
gRPC (the generated `rft.v1` stubs and the channel factory of `services.common.rpc`), never import a
service, so they judge any implementation of the contract, in any language. What the services share
(bounds, auth before parse, the runner) is in `harness`.
"""

package xdsproxy

const grpcClientEnv = "XDSPROXY_TEST_GRPC_CLIENT"

func runGRPCClient() int { return 2 }

"""The A3S CodeAgentService face over grpc.aio."""

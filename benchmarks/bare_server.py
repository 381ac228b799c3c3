"""The baseline of the `foundation` section: a grpc.aio server with one trivial unary method
(HealthCheck) and nothing else. `python -m benchmarks.bare_server PORT` serves on 127.0.0.1:PORT
until SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc


class Bare(pb_grpc.CodeAgentServiceServicer):
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: object) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(status=pb.HealthCheckResponse.STATUS_HEALTHY)


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_CodeAgentServiceServicer_to_server(Bare(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))

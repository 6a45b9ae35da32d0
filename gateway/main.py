"""The process edge: `run_gateway(GatewaySettings())` serves the app with uvicorn until stopped."""

from __future__ import annotations

import logging

import uvicorn

from gateway.app import create_app
from shared.heap import freeze_startup_heap
from shared.settings import GatewaySettings

GRACEFUL_SHUTDOWN_S = 30  # let in-flight streams finish before the workers' events stop mattering


def run_gateway(settings: GatewaySettings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    freeze_startup_heap()  # this process is the gateway: what start-up made stays out of collections
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def main() -> None:
    run_gateway(GatewaySettings())


if __name__ == "__main__":
    main()

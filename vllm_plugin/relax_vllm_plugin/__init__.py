"""Relax's vLLM plugin: registers the weight transfer engine ``relax_gloo`` (engine.py) in
every vLLM process (the entry point group ``vllm.general_plugins``, which vLLM loads in its
API server, engine core and workers alike). Lazy: the engine's module is imported only by a
server started with ``--weight-transfer-config '{"backend": "relax_gloo"}'``."""

ENGINE = "relax_gloo"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if ENGINE not in WeightTransferEngineFactory._registry:  # loaded once per process; be safe
        WeightTransferEngineFactory.register_engine(ENGINE, "relax_vllm_plugin.engine",
                                                    "GlooWeightTransferEngine")

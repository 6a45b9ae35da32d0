"""`arbor bench`: decode speed per speculation mode, and the served stack under load.

    arbor bench decode   # Arbor's modes vs transformers generate, in process, one model
    arbor bench serving  # embedded Redis + gateway + workers, streaming clients, latency and throughput

Each run writes JSON, a markdown table and PNG plots to bench-results/<timestamp>/. Contenders
are interleaved (per prompt, or per request) so that load from elsewhere on a shared machine
hits all of them alike; the ratios are the figures to trust, the absolute rates move with load.
"""

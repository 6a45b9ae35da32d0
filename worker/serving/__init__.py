"""The serving loop: the owner thread, its batch scheduler, the lanes over the model runner, the
paired prefill cache, and each lane's text output. Nothing here talks to Redis."""

"""OpenAI's Responses API (/v1/responses), served through the chat route's job and event stream.

request.py     the body, validated          translate.py  -> a chat job, warnings
objects.py     the response object          assembler.py  events -> output items, stream events
store.py       stored responses (Redis)     routes.py     POST, GET, DELETE
"""

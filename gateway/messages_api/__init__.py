"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over the chat job.

request.py    the request body, validated (Anthropic's field names in every error)
translate.py  request -> the ChatCompletionRequest the chat route would enqueue
reply.py      a finished job -> one `message` body
stream.py     the job's events -> Anthropic's server-sent event sequence
errors.py     Anthropic's error envelope
route.py      the two handlers: validate, admit, enqueue, reply
"""

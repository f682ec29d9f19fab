"""
The whole AMQP 0-9-1 wire, with no Twisted and no broker imports: spec constants and method classes,
codec, errors, frames (FrameReader) and the connection/channel engines (bytes in, events out, in the
server or the client role).
"""

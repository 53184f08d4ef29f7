"""Networking without maths: the tensor codec, Thrift transports, clients and servers."""

"""Relax-level registration: struct-info inference and legalization of the RoIAlign ops."""

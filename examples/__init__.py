"""Runnable examples of attnres-ge, installed as attnres_ge.examples."""

"""Data: vocabulary, span corruption, tasks (in progress)."""

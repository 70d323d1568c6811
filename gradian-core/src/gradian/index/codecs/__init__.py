"""Storage codecs for index shards; each is registered through the ``gradian_storage_codecs`` hook."""

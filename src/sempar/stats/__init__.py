"""Mergeable routing statistics (`RoutingStats`, the `sempar stats` verb): built shard by shard
(`build`, `run`), merged (`routing_stats`), saved and loaded with every part checked (`file`),
the optional parts by name (`parts`) and the seeded request sample they keep (`sample`)."""

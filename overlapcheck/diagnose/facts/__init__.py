"""Facts about one rank that several rules share, computed once: the `RankFacts` view and what it derives."""

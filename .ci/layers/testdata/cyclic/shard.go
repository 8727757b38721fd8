package cyclic

type shard struct{ t *table }

func (s *shard) lock() int { return s.t.now() }

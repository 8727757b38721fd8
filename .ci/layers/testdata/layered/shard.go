package layered

type shard struct{ entries map[string]*entry }

func (s *shard) find(key string) *entry { return s.entries[key] }

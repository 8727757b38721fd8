package layered

func Use(key string) bool {
	s := &shard{entries: map[string]*entry{key: {}}}
	return s.find(key).find(0)
}

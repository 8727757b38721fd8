package cyclic

func Use() int {
	t := &table{shards: make([]shard, 1)}
	t.shards[0].t = t
	return t.shards[0].lock()
}

package layered

type entry struct{ holders []int }

func (e *entry) find(token int) bool { return len(e.holders) > token }

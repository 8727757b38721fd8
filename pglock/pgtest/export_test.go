package pgtest

// GroupGone reports whether no process of a process group is left but
// zombies.
var GroupGone = groupGone

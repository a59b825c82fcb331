package projections

// lru is the projector's list of the sessions it tracks, most recently
// active first. It is intrusive: the links are fields of tracked, so an
// entry costs no list element of its own (an idle state held is mostly
// its compressed form; a separate element was a twentieth of it, and an
// object that outlived the state's around it in memory).
type lru struct {
	head, tail *tracked
	n          int
}

// pushFront puts t, which is in no list, first.
func (l *lru) pushFront(t *tracked) {
	t.prev, t.next, t.listed = nil, l.head, true
	if l.head != nil {
		l.head.prev = t
	} else {
		l.tail = t
	}
	l.head = t
	l.n++
}

// remove takes t out of the list; a t that is not in it is left alone.
func (l *lru) remove(t *tracked) {
	if !t.listed {
		return
	}
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		l.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		l.tail = t.prev
	}
	t.prev, t.next, t.listed = nil, nil, false
	l.n--
}

// moveToFront puts t, which is in the list, first.
func (l *lru) moveToFront(t *tracked) {
	if l.head == t {
		return
	}
	l.remove(t)
	l.pushFront(t)
}

// back is the least recently active entry, or nil.
func (l *lru) back() *tracked { return l.tail }

// len is how many entries the list holds.
func (l *lru) len() int { return l.n }

package pgroup

import (
	"encoding/binary"
	"hash/fnv"
	"sort"
)

// Assign returns the owner of each of partitions partitions among members
// of group: a deterministic function of its arguments alone, so every
// member that sees the same membership agrees on it without a leader.
//
// It is rendezvous (highest random weight) hashing with balanced loads:
// each partition in order goes to the member of highest weight
// FNV-1a(group, partition, member) that still has room, where room is
// floor(P/N) partitions per member and, for P mod N of them, one more. So
// every member owns floor(P/N) or ceil(P/N) partitions, and a member that
// joins or leaves moves few partitions besides its own. members may be in
// any order and hold duplicates; the result is nil when members is empty.
func Assign(group string, members []string, partitions int) []string {
	ms := uniqueSorted(members)
	if len(ms) == 0 || partitions <= 0 {
		return nil
	}
	n := len(ms)
	floor, extra := partitions/n, partitions%n
	load := make(map[string]int, n)
	atCeil := 0
	owner := make([]string, partitions)
	rs := make([]rankedMember, n)
	for p := 0; p < partitions; p++ {
		for i, m := range ms {
			rs[i] = rankedMember{name: m, weight: weight(group, p, m)}
		}
		sort.Slice(rs, func(i, j int) bool {
			if rs[i].weight != rs[j].weight {
				return rs[i].weight > rs[j].weight
			}
			return rs[i].name < rs[j].name
		})
		for _, r := range rs {
			l := load[r.name]
			if l < floor || (l == floor && atCeil < extra) {
				if l == floor {
					atCeil++
				}
				load[r.name] = l + 1
				owner[p] = r.name
				break
			}
		}
	}
	return owner
}

type rankedMember struct {
	name   string
	weight uint64
}

// weight is the rendezvous weight of member for partition p of group.
func weight(group string, p int, member string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(group))
	_, _ = h.Write([]byte{0})
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(p))
	_, _ = h.Write(b[:])
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(member))
	// FNV's low bits mix poorly for short inputs: finish with a
	// multiply-xorshift so nearby partitions rank members independently.
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func uniqueSorted(xs []string) []string {
	out := append([]string(nil), xs...)
	sort.Strings(out)
	j := 0
	for i, x := range out {
		if i > 0 && x == out[j-1] {
			continue
		}
		out[j] = x
		j++
	}
	return out[:j]
}

// Owned returns the partitions Assign gives member, in order.
func Owned(group string, members []string, partitions int, member string) []int {
	var out []int
	for p, m := range Assign(group, members, partitions) {
		if m == member {
			out = append(out, p)
		}
	}
	return out
}

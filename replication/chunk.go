package replication

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// pending is a message waiting to be published: its flags and its encoded
// operations. The envelope's head (owner, epoch, the previous message's
// sequence number) is added when it is published, since the previous
// message is known only then.
type pending struct {
	flags  uint64
	ops    []byte // envOp fields
	count  int    // operations (or parts) it holds
	last   op     // the last operation's type and time, for metrics
	tables bool   // an operation has a label table (format 2)
}

// version returns the format the message needs: format 1 when it has no
// label table, so that a fleetgraph that reads only format 1 reads every
// message but snapshots.
func (p *pending) version() byte {
	if p.tables {
		return formatV2
	}
	return formatV1
}

// chunker packs operations into messages of at most budget bytes of
// operations (before compression), splitting the rows of a large
// operation into parts. A snapshot gets messages of its own.
type chunker struct {
	budget int
	// noTables writes snapshots as format 1 does, with each row's labels
	// (tests of reading format 1).
	noTables bool
	out      []pending
	cur      pending
	part     []byte  // scratch for one operation part
	row      []byte  // scratch for one row
	labels   []label // scratch for one row's labels
}

func newChunker(budget int) *chunker { return &chunker{budget: budget} }

// flush ends the current message.
func (c *chunker) flush() {
	if c.cur.count > 0 {
		c.out = append(c.out, c.cur)
	}
	c.cur = pending{}
}

// add appends one operation. Its rows go into as many parts as the budget
// needs; every part repeats the operation's type, time and kind, and only
// the first carries a snapshot's cluster row and kinds. Each part of a
// snapshot carries the label table of its rows (format 2).
func (c *chunker) add(o *op, flags uint64) {
	if c.cur.flags != flags {
		c.flush()
		c.cur.flags = flags
	}
	head := *o
	head.rows, head.more, head.labels = nil, false, nil
	done := 0 // rows in earlier parts
	for {
		var tab *labelTable
		if o.typ == opSnapshot && !c.noTables {
			tab = newLabelTable()
		}
		c.part = appendOpHead(c.part[:0], &head)
		n := 0
		for done+n < len(o.rows) {
			var m tableMark
			if tab != nil {
				m = tab.mark()
			}
			c.labels = rowLabels(c.labels[:0], o, done+n)
			c.row = appendRow(c.row[:0], &o.rows[done+n], c.labels, tab)
			size := protowire.SizeTag(opFieldRow) + protowire.SizeBytes(len(c.row)) + tab.size()
			full := len(c.cur.ops)+len(c.part)+size+16 > c.budget
			if full && (n > 0 || c.cur.count > 0) {
				// The row goes into the next part (n > 0) or starts a
				// new message.
				if tab != nil {
					tab.rollback(m)
				}
				break
			}
			c.part = protowire.AppendTag(c.part, opFieldRow, protowire.BytesType)
			c.part = protowire.AppendBytes(c.part, c.row)
			n++
		}
		if n == 0 && done < len(o.rows) {
			c.flush()
			c.cur.flags = flags
			continue
		}
		if tab != nil && len(tab.pairs) > 0 {
			c.part = tab.appendTo(c.part)
			c.cur.tables = true
		}
		done += n
		more := done < len(o.rows)
		if more {
			c.part = appendVarint(c.part, opFieldMore, 1)
		}
		c.cur.ops = protowire.AppendTag(c.cur.ops, envOp, protowire.BytesType)
		c.cur.ops = protowire.AppendBytes(c.cur.ops, c.part)
		c.cur.count++
		c.cur.last = head
		if !more {
			return
		}
		c.flush()
		c.cur.flags = flags
		head.cluster, head.kinds = nil, nil
	}
}

// addSnapshot appends a snapshot: messages of its own, the first flagged
// flagFirst and the last flagLast. A forced snapshot (flagForce) is
// applied by every replica; the others only by replicas that lack the
// state they copy.
func (c *chunker) addSnapshot(o *op, force bool) {
	c.flush()
	start := len(c.out)
	flags := uint64(flagSnapshot)
	if force {
		flags |= flagForce
	}
	c.add(o, flags)
	c.flush()
	c.out[start].flags |= flagFirst
	c.out[len(c.out)-1].flags |= flagLast
}

// messages returns the messages built so far and starts again.
func (c *chunker) messages() []pending {
	c.flush()
	out := c.out
	c.out = nil
	return out
}

// rowLabels appends the labels of o's row i to dst, sorted by key: from
// o's label table, or the row's own.
func rowLabels(dst []label, o *op, i int) []label {
	if t := o.labels; t != nil {
		for _, r := range t.Row(i) {
			dst = append(dst, label{t.Strings[t.Pairs[r].Key], t.Strings[t.Pairs[r].Value]})
		}
		slices.SortFunc(dst, func(a, b label) int { return strings.Compare(a.key, b.key) })
		return dst
	}
	for k, v := range o.rows[i].Labels.All() {
		dst = append(dst, label{k, v})
	}
	return dst
}

package replication

import (
	"google.golang.org/protobuf/encoding/protowire"
)

// pending is a message waiting to be published: its flags and its encoded
// operations. The envelope's head (owner, epoch, the previous message's
// sequence number) is added when it is published, since the previous
// message is known only then.
type pending struct {
	flags uint64
	ops   []byte // envOp fields
	count int    // operations (or parts) it holds
	last  op     // the last operation's type and time, for metrics
}

// chunker packs operations into messages of at most budget bytes of
// operations (before compression), splitting the rows of a large
// operation into parts. A snapshot gets messages of its own.
type chunker struct {
	budget int
	out    []pending
	cur    pending
	part   []byte // scratch for one operation part
	row    []byte // scratch for one row
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
// the first carries a snapshot's cluster row and kinds.
func (c *chunker) add(o *op, flags uint64) {
	if c.cur.flags != flags {
		c.flush()
		c.cur.flags = flags
	}
	head := *o
	head.rows, head.more = nil, false
	rows := o.rows
	for {
		c.part = appendOpHead(c.part[:0], &head)
		n := 0
		for n < len(rows) {
			c.row = appendRow(c.row[:0], &rows[n])
			size := protowire.SizeTag(opFieldRow) + protowire.SizeBytes(len(c.row))
			if n > 0 && len(c.cur.ops)+len(c.part)+size+16 > c.budget {
				break
			}
			if n == 0 && c.cur.count > 0 && len(c.cur.ops)+len(c.part)+size+16 > c.budget {
				break // start a new message for this part
			}
			c.part = protowire.AppendTag(c.part, opFieldRow, protowire.BytesType)
			c.part = protowire.AppendBytes(c.part, c.row)
			n++
		}
		if n == 0 && len(rows) > 0 {
			c.flush()
			c.cur.flags = flags
			continue
		}
		more := n < len(rows)
		if more {
			c.part = appendVarint(c.part, opFieldMore, 1)
		}
		c.cur.ops = protowire.AppendTag(c.cur.ops, envOp, protowire.BytesType)
		c.cur.ops = protowire.AppendBytes(c.cur.ops, c.part)
		c.cur.count++
		c.cur.last = head
		rows = rows[n:]
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

package index

import "context"

// PageRowIDs returns the row ids of the rows of q's page, for benchmarks
// of pageObjects alone.
func PageRowIDs(s *Store, q Query) []uint32 {
	p, err := s.Query(context.Background(), q)
	if err != nil {
		panic(err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	ids := make([]uint32, 0, len(p.Edges))
	for _, e := range p.Edges {
		k := e.Object.Key()
		ids = append(ids, s.x.lookup(&k).rid)
	}
	return ids
}

// PageObjects sets edges[i].Object to the Object of row rids[i], as a
// page does (pageObjects), under the read lock.
func PageObjects(s *Store, rids []uint32, edges []Edge) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var buf [128]*objRow
	rows := buf[:0]
	for _, rid := range rids {
		rows = append(rows, s.x.rows[rid])
	}
	s.x.pageObjects(edges[:len(rows)], rows)
}

// PlanOnly runs q's plan (compile, source choice and collect) under the
// read lock, without building the page's objects, and returns its rows.
// Benchmarks of the external test package time the plan with it.
func PlanOnly(s *Store, q *Query) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, err := s.x.compile(s.db, &q.Filter, q.Access)
	if err != nil {
		return 0, err
	}
	p.paced(s, context.Background())
	defer p.end()
	rows, _, _, err := p.run(q.Order, nil, q.First, false)
	return len(rows), err
}

// CompileOnly compiles q's filter under the read lock.
func CompileOnly(s *Store, q *Query) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, err := s.x.compile(s.db, &q.Filter, q.Access)
	if err == nil { // as a page ends it
		p.paced(s, context.Background())
		p.end()
	}
	return err
}

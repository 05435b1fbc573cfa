package postgres

// DecideSQL exposes the decide statement a Store sends, for tests that run
// it inside a transaction of their own.
func DecideSQL(s *Store) string { return s.q.decide }

// Package security_test holds the security review's scenarios as tests against the real
// operator, conversation service and both brokers (docs/security.md's table): identity claims,
// tenancy, the caller rule, the sender stamp, flood isolation (BenchmarkFloodIsolation).
package security_test

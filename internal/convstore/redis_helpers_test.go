package convstore

import (
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/redistest"
)

// startRedis runs a throwaway redis-server (no persistence, temp dir) on a
// free loopback port for the test and returns its address.
func startRedis(t testing.TB) string {
	t.Helper()
	return redistest.Start(t, redistest.Options{}).Addr()
}

// openRedisURL opens a journal on a store URL (convstore.ParseRedisURL).
func openRedisURL(t testing.TB, storeURL, prefix string) *RedisJournal {
	t.Helper()
	rs, err := ParseRedisURL(storeURL)
	if err != nil {
		t.Fatal(err)
	}
	return NewRedisJournalWith(rs.NewClient(), RedisJournalOptions{Prefix: prefix, WaitReplicas: rs.WaitReplicas, WaitTimeout: rs.WaitTimeout})
}

// onRedisStores runs test on one redis-server and on a cluster of 3
// primaries with a replica each (commits waiting for it): open returns a
// journal (its own client) on the store, under prefix.
func onRedisStores(t *testing.T, test func(t *testing.T, open func(prefix string) *RedisJournal)) {
	t.Run("redis", func(t *testing.T) {
		addr := startRedis(t)
		test(t, func(prefix string) *RedisJournal { return openRedisURL(t, "redis://"+addr+"/0", prefix) })
	})
	t.Run("cluster", func(t *testing.T) {
		url := redistest.StartCluster(t, 3, 1).StoreURL("wait_replicas=1")
		test(t, func(prefix string) *RedisJournal { return openRedisURL(t, url, prefix) })
	})
}

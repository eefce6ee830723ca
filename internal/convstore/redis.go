package convstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// Redis is the shared store for several service replicas. Update is
// optimistic: a Lua script loads the View atomically, the engine decides in
// the replica, and a second Lua script commits only if the context's
// version, the owners of the tasks it adds, and (when the context joins the
// live set) the agent's membership version are unchanged; otherwise Update
// reloads and decides again.
//
// Keys (P = prefix, A = agent; {A} is a Redis Cluster hash tag, so every
// key a script touches lives in one slot):
//
//	P:{A}:c:<contextID>  hash v=version d=JSON conversation.Context
//	P:{A}:t              hash taskID → contextID
//	P:{A}:e              zset contextID → ExpiresAt (µs, +inf = never): live set
//	P:{A}:d              zset contextID → NextDeadline (µs): sweeper index
//	P:{A}:s              set of every stored contextID (recovery)
//	P:{A}:m              counter bumped whenever the live set gains or loses
//	                     a member
//	P:agents             set of agents (outside the hash tag; written before
//	                     the first commit for an agent, idempotently)
type Redis struct {
	c         redis.UniversalClient
	prefix    string
	conflicts atomic.Int64
}

// Conflicts returns how many commits lost an optimistic-concurrency race and
// were decided again (a contention metric).
func (r *Redis) Conflicts() int64 { return r.conflicts.Load() }

// NewRedis returns a store on client c, which it owns (Close closes it).
// prefix namespaces the keys ("" = "a2af"), so several deployments or tests
// can share a server.
func NewRedis(c redis.UniversalClient, prefix string) *Redis {
	if prefix == "" {
		prefix = "a2af"
	}
	return &Redis{c: c, prefix: prefix}
}

// Ping checks that Redis answers (readiness).
func (r *Redis) Ping(ctx context.Context) error {
	if err := r.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

// Close closes the client.
func (r *Redis) Close() error {
	if err := r.c.Close(); err != nil {
		return fmt.Errorf("close redis store: %w", err)
	}
	return nil
}

type redisKeys struct {
	ctx, task, exp, due, mem, all string
}

func (r *Redis) keys(agent, contextID string) redisKeys {
	base := r.prefix + ":{" + agent + "}:"
	return redisKeys{
		ctx: base + "c:" + contextID, task: base + "t", exp: base + "e",
		due: base + "d", mem: base + "m", all: base + "s",
	}
}

func (r *Redis) agentsKey() string { return r.prefix + ":agents" }

func micros(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }

// loadScript reads a View atomically: the context record, the owner of the
// key's task, the live count at now and the membership version.
var loadScript = redis.NewScript(`
local rec = redis.call('HMGET', KEYS[1], 'v', 'd')
local owner = false
if ARGV[1] ~= '' then owner = redis.call('HGET', KEYS[2], ARGV[1]) end
local live = redis.call('ZCOUNT', KEYS[3], '(' .. ARGV[2], '+inf')
local mem = redis.call('GET', KEYS[4])
return {rec[1] or false, rec[2] or false, owner or false, live, mem or false}
`)

// commitScript writes a decision if what it was based on is unchanged.
// Returns 1 on success, 0 on a version conflict, -1 when an added task
// already belongs to another context. ARGV[11] is a random token stored
// with the record: if the client resent the script after a lost reply, the
// version differs but the token is ours, and the commit counts as done
// (otherwise the replica would re-decide on its own write and, for
// example, drop the request as a duplicate delivery).
var commitScript = redis.NewScript(`
local ctx = ARGV[9]
if (redis.call('HGET', KEYS[1], 'v') or '0') ~= ARGV[1] then
  if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 't') == ARGV[11] then return 1 end
  return 0
end
if ARGV[2] == '1' and (redis.call('GET', KEYS[5]) or '0') ~= ARGV[3] then return 0 end
local nAdded = tonumber(ARGV[10])
for i = 12, 11 + nAdded do
  local owner = redis.call('HGET', KEYS[2], ARGV[i])
  if owner and owner ~= ctx then return -1 end
end
if ARGV[5] == '' then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[6], ctx)
else
  redis.call('HSET', KEYS[1], 'v', ARGV[6], 'd', ARGV[5], 't', ARGV[11])
  redis.call('SADD', KEYS[6], ctx)
end
if ARGV[7] == '' then redis.call('ZREM', KEYS[3], ctx) else redis.call('ZADD', KEYS[3], ARGV[7], ctx) end
if ARGV[8] == '' then redis.call('ZREM', KEYS[4], ctx) else redis.call('ZADD', KEYS[4], ARGV[8], ctx) end
for i = 12 + nAdded, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ctx then redis.call('HDEL', KEYS[2], ARGV[i]) end
end
for i = 12, 11 + nAdded do redis.call('HSET', KEYS[2], ARGV[i], ctx) end
if ARGV[4] == '1' then redis.call('INCR', KEYS[5]) end
return 1
`)

type redisSnapshot struct {
	view    conversation.View
	version string // "0" when absent
	mem     string // "0" when absent
}

func (r *Redis) load(ctx context.Context, key Key, now time.Time) (redisSnapshot, error) {
	k := r.keys(key.Agent, key.ContextID)
	res, err := loadScript.Run(ctx, r.c, []string{k.ctx, k.task, k.exp, k.mem}, key.TaskID, micros(now)).Slice()
	if err != nil {
		return redisSnapshot{}, fmt.Errorf("load %s/%s: %w", key.Agent, key.ContextID, err)
	}
	if len(res) != 5 {
		return redisSnapshot{}, fmt.Errorf("load %s/%s: unexpected reply %v", key.Agent, key.ContextID, res)
	}
	s := redisSnapshot{view: conversation.View{ContextID: key.ContextID}, version: "0", mem: "0"}
	if v, ok := res[0].(string); ok {
		s.version = v
		data, _ := res[1].(string)
		c, err := decodeContext([]byte(data))
		if err != nil {
			return s, fmt.Errorf("context %s/%s: %w", key.Agent, key.ContextID, err)
		}
		if c.Version, err = strconv.ParseUint(v, 10, 64); err != nil {
			return s, fmt.Errorf("context %s/%s: version %q: %w", key.Agent, key.ContextID, v, err)
		}
		s.view.Context = c
	}
	if owner, ok := res[2].(string); ok {
		s.view.TaskContextID = owner
	}
	live, _ := res[3].(int64)
	s.view.LiveContexts = int(live)
	if m, ok := res[4].(string); ok {
		s.mem = m
	}
	return s, nil
}

// Update implements Store.
func (r *Redis) Update(ctx context.Context, key Key, now time.Time, fn func(*Txn) error) error {
	registered := false
	for attempt := 0; attempt < MaxAttempts; attempt++ {
		if attempt > 1 {
			// Contention: spread the retries so racing replicas do not
			// collide in lockstep.
			d := time.Duration(rand.Int64N(int64(attempt) * int64(200*time.Microsecond)))
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		snap, err := r.load(ctx, key, now)
		if err != nil {
			return err
		}
		t := &Txn{View: snap.view, Now: now}
		if err := fn(t); err != nil {
			return err
		}
		if !t.write {
			return nil
		}
		if !registered && snap.view.Context == nil {
			if err := r.c.SAdd(ctx, r.agentsKey(), key.Agent).Err(); err != nil {
				return fmt.Errorf("register agent %s: %w", key.Agent, err)
			}
			registered = true
		}
		ok, err := r.commit(ctx, key, snap, t.put)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		r.conflicts.Add(1)
	}
	return fmt.Errorf("update %s/%s: %w after %d attempts", key.Agent, key.ContextID, ErrConflict, MaxAttempts)
}

func (r *Redis) commit(ctx context.Context, key Key, snap redisSnapshot, n *conversation.Context) (bool, error) {
	if n != nil && n.ID != key.ContextID {
		return false, fmt.Errorf("put context %q under key %q", n.ID, key.ContextID)
	}
	k := r.keys(key.Agent, key.ContextID)
	ch := diff(snap.view.Context, n)
	var data, newVersion, expScore, dueScore string
	if n != nil {
		v, err := strconv.ParseUint(snap.version, 10, 64)
		if err != nil {
			return false, fmt.Errorf("version %q: %w", snap.version, err)
		}
		n.Version = v + 1
		newVersion = strconv.FormatUint(n.Version, 10)
		raw, err := json.Marshal(n)
		if err != nil {
			return false, fmt.Errorf("encode context %s/%s: %w", key.Agent, key.ContextID, err)
		}
		data = string(raw)
		if n.Expired == nil {
			expScore = "+inf"
			if !n.ExpiresAt.IsZero() {
				expScore = micros(n.ExpiresAt)
			}
		}
		if !n.NextDeadline.IsZero() {
			dueScore = micros(n.NextDeadline)
		}
	}
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	token := strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64(), 36)
	args := make([]any, 0, 11+len(ch.added)+len(ch.removed))
	args = append(args, snap.version, flag(ch.becomesLive), snap.mem, flag(ch.becomesLive || ch.leavesLive),
		data, newVersion, expScore, dueScore, key.ContextID, len(ch.added), token)
	for _, id := range ch.added {
		args = append(args, id)
	}
	for _, id := range ch.removed {
		args = append(args, id)
	}
	res, err := commitScript.Run(ctx, r.c, []string{k.ctx, k.task, k.exp, k.due, k.mem, k.all}, args...).Int64()
	if err != nil {
		return false, fmt.Errorf("commit %s/%s: %w", key.Agent, key.ContextID, err)
	}
	// -1 (an added task appeared in another context meanwhile) is a
	// conflict like 0: the next attempt sees the owner and the engine
	// answers -32602.
	return res == 1, nil
}

// Context implements Store.
func (r *Redis) Context(ctx context.Context, agent, contextID string) (*conversation.Context, error) {
	res, err := r.c.HMGet(ctx, r.keys(agent, contextID).ctx, "v", "d").Result()
	if err != nil {
		return nil, fmt.Errorf("context %s/%s: %w", agent, contextID, err)
	}
	v, ok := res[0].(string)
	if !ok {
		return nil, fmt.Errorf("context %s/%s: %w", agent, contextID, ErrNotFound)
	}
	data, _ := res[1].(string)
	c, err := decodeContext([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("context %s/%s: %w", agent, contextID, err)
	}
	if c.Version, err = strconv.ParseUint(v, 10, 64); err != nil {
		return nil, fmt.Errorf("context %s/%s: version %q: %w", agent, contextID, v, err)
	}
	return c, nil
}

// TaskContext implements Store.
func (r *Redis) TaskContext(ctx context.Context, agent, taskID string) (string, error) {
	id, err := r.c.HGet(ctx, r.keys(agent, "").task, taskID).Result()
	if errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("task %s/%s: %w", agent, taskID, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("task %s/%s: %w", agent, taskID, err)
	}
	return id, nil
}

// LiveContexts implements Store.
func (r *Redis) LiveContexts(ctx context.Context, agent string, now time.Time) (int, error) {
	n, err := r.c.ZCount(ctx, r.keys(agent, "").exp, "("+micros(now), "+inf").Result()
	if err != nil {
		return 0, fmt.Errorf("live contexts of %s: %w", agent, err)
	}
	return int(n), nil
}

// agents lists the registered agents.
func (r *Redis) agents(ctx context.Context) ([]string, error) {
	var out []string
	it := r.c.SScan(ctx, r.agentsKey(), 0, "", 1000).Iterator()
	for it.Next(ctx) {
		out = append(out, it.Val())
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return out, nil
}

// Contexts implements Store. Unlike Bolt's, the listing is not one
// snapshot: contexts changed while it runs may be seen before or after.
func (r *Redis) Contexts(ctx context.Context, fn func(agent string, c *conversation.Context) error) error {
	agents, err := r.agents(ctx)
	if err != nil {
		return err
	}
	for _, agent := range agents {
		k := r.keys(agent, "")
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			cmds := make([]*redis.SliceCmd, len(batch))
			_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, id := range batch {
					cmds[i] = p.HMGet(ctx, r.keys(agent, id).ctx, "v", "d")
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("load contexts of %s: %w", agent, err)
			}
			for i, cmd := range cmds {
				res := cmd.Val()
				v, ok := res[0].(string)
				if !ok {
					continue // deleted since the scan
				}
				data, _ := res[1].(string)
				c, err := decodeContext([]byte(data))
				if err != nil {
					return fmt.Errorf("context %s/%s: %w", agent, batch[i], err)
				}
				if c.Version, err = strconv.ParseUint(v, 10, 64); err != nil {
					return fmt.Errorf("context %s/%s: version %q: %w", agent, batch[i], v, err)
				}
				if err := fn(agent, c); err != nil {
					return err
				}
			}
			batch = batch[:0]
			return nil
		}
		it := r.c.SScan(ctx, k.all, 0, "", 1000).Iterator()
		for it.Next(ctx) {
			batch = append(batch, it.Val())
			if len(batch) == 500 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("list contexts of %s: %w", agent, err)
		}
		if err := flush(); err != nil {
			return err
		}
	}
	return nil
}

// Due implements Store.
func (r *Redis) Due(ctx context.Context, now time.Time, limit int) ([]Ref, error) {
	agents, err := r.agents(ctx)
	if err != nil {
		return nil, err
	}
	var refs []Ref
	for _, agent := range agents {
		if len(refs) >= limit {
			break
		}
		ids, err := r.c.ZRangeArgs(ctx, redis.ZRangeArgs{
			Key: r.keys(agent, "").due, Start: "-inf", Stop: micros(now), ByScore: true,
			Count: int64(limit - len(refs)),
		}).Result()
		if err != nil {
			return nil, fmt.Errorf("due contexts of %s: %w", agent, err)
		}
		for _, id := range ids {
			refs = append(refs, Ref{Agent: agent, ContextID: id})
		}
	}
	return refs, nil
}

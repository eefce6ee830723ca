package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/version"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// options are the flags of one command (each command registers the ones it takes).
type options struct {
	org               string
	wait              time.Duration
	stream            bool
	approve, deny     bool
	taskID, contextID string
	statePath         string
}

// command is one a2actl subcommand: its help and how it runs.
type command struct {
	name string
	// synopsis is the usage line; summary says what the command does in a few words.
	synopsis, summary string
	// about is the longer description of `a2actl COMMAND -h`.
	about string
	// examples are command lines a newcomer can copy (against `make dev`).
	examples []string
	// connects: the command talks to the broker (its help lists the connection variables).
	connects bool
	flags    func(fs *flag.FlagSet, o *options)
	run      func(c *cli, ctx context.Context, o *options, pos []string) int
}

// commands are a2actl's subcommands, in the order the help lists them (a function: the help of
// each refers back to the list).
func commands() []command {
	return []command{
		{
			name: "agents", synopsis: "agents [--org ORG] [--wait 1s]", summary: "list agents and their presence",
			about: "Lists the agents whose cards are retained on the broker, with their presence (online,\n" +
				"offline, and who said so) and the card's name and description. With a trust anchor\n" +
				"(--card-keys, or the key set the operator retains) a SIGNATURE column says whether each\n" +
				"card verifies.",
			examples: []string{"KUBECONFIG=bin/dev/kubeconfig a2actl agents --org acme --as-agent console"},
			connects: true,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.org, "org", "", "only this org")
				fs.DurationVar(&o.wait, "wait", time.Second, "how long to collect retained cards")
			},
			run: runAgents,
		},
		{
			name: "send", synopsis: `send ORG/UNIT/AGENT "text" [--stream]`, summary: "send one message, print the answer",
			about: "Sends one message and prints the answer (with --stream, every event as it comes).\n" +
				"--task-id and --context-id continue a task, e.g. one that asked for input; --approve or\n" +
				"--deny answer an approval request (\"text\" is the reason, sent beside an approve/deny\n" +
				"data part).",
			examples: []string{
				`KUBECONFIG=bin/dev/kubeconfig a2actl send --as-agent console acme/demo/echo "hello"`,
				`a2actl send acme/demo/confirm "checked" --approve --task-id "$T" --context-id "$C"`,
			},
			connects: true,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.stream, "stream", false, "use SendStreamingMessage and print every event")
				fs.StringVar(&o.taskID, "task-id", "", "continue this task (e.g. answer input-required)")
				fs.StringVar(&o.contextID, "context-id", "", "conversation context id")
				fs.BoolVar(&o.approve, "approve", false, "answer an approval request with an approve data part (text = reason)")
				fs.BoolVar(&o.deny, "deny", false, "answer an approval request with a deny data part (text = reason)")
			},
			run: runSend,
		},
		{
			name: "chat", synopsis: "chat ORG/UNIT/AGENT [--state FILE]", summary: "interactive multi-turn conversation",
			about: "An interactive conversation: each line is a message; when the agent asks for input the\n" +
				"next line answers it on the same task. When the agent expects an approval, answer\n" +
				"approve, yes or go ahead (or deny, no), or /approve, /deny REASON. /new starts a new\n" +
				"conversation, /quit exits; --state keeps the conversation in a file between runs.",
			examples: []string{"KUBECONFIG=bin/dev/kubeconfig a2actl chat --as-agent console acme/demo/confirm"},
			connects: true,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.statePath, "state", "", "conversation state file (loaded if present, saved after each turn)")
			},
			run: runChat,
		},
		{
			name: "card", synopsis: "card verify ORG/UNIT/AGENT", summary: "check an agent card's signature",
			about: "Checks the signature of an agent's retained card: verified, unverified (unsigned) or\n" +
				"invalid (tampered with, or signed by another key). Exit 0 only when it verifies.",
			examples: []string{"KUBECONFIG=bin/dev/kubeconfig a2actl card verify acme/demo/echo --as-agent console"},
			connects: true,
			run:      func(c *cli, ctx context.Context, _ *options, pos []string) int { return c.card(ctx, pos) },
		},
		{
			name: "version", synopsis: "version", summary: "print the version and source commit",
			about:    "Prints a2actl's version and the commit it was built from.",
			examples: []string{"a2actl version"},
			run: func(c *cli, _ context.Context, _ *options, _ []string) int {
				fmt.Fprintln(c.stdout, version.Get().String("a2actl"))
				return exitOK
			},
		},
	}
}

func commandNamed(name string) (command, bool) {
	for _, cmd := range commands() {
		if cmd.name == name {
			return cmd, true
		}
	}
	return command{}, false
}

// help is `a2actl COMMAND -h`: synopsis, description, examples, the command's own flags and the
// environment variables it reads.
func (cmd command) help() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: a2actl %s\n\n%s\n", cmd.synopsis, cmd.about)
	if cmd.flags != nil {
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		fs.SetOutput(&b)
		cmd.flags(fs, &options{})
		b.WriteString("\nFlags:\n")
		fs.PrintDefaults()
	}
	b.WriteString("\nExamples:\n")
	for _, e := range cmd.examples {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	if cmd.connects {
		b.WriteString("\nEnvironment (what the global flags default to):\n")
		for line := range slices.Chunk(connectionEnv, 6) {
			fmt.Fprintf(&b, "  %s\n", strings.Join(line, " "))
		}
		b.WriteString("\nGlobal flags (--broker, --as-agent, -n, --username, --password, --tls-*, --timeout, --json, ...):\nsee a2actl -h.\n")
	}
	return b.String()
}

func runAgents(c *cli, ctx context.Context, o *options, pos []string) int {
	if len(pos) != 0 {
		return c.usageErr("agents takes no arguments")
	}
	return c.agents(ctx, o.org, o.wait)
}

func runSend(c *cli, ctx context.Context, o *options, pos []string) int {
	if len(pos) != 2 {
		return c.usageErr(`send needs ORG/UNIT/AGENT and "text"`)
	}
	ref, err := a2amqtt.ParseAgentRef(pos[0])
	if err != nil {
		return c.usageErr(err.Error())
	}
	if o.approve && o.deny {
		return c.usageErr("--approve and --deny exclude each other")
	}
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(pos[1]))
	if o.approve || o.deny {
		msg = approvalAnswer(o.approve, pos[1], pos[1])
	}
	msg.TaskID, msg.ContextID = a2a.TaskID(o.taskID), o.contextID
	return c.send(ctx, ref, msg, o.stream)
}

func runChat(c *cli, ctx context.Context, o *options, pos []string) int {
	if len(pos) != 1 {
		return c.usageErr("chat needs ORG/UNIT/AGENT")
	}
	ref, err := a2amqtt.ParseAgentRef(pos[0])
	if err != nil {
		return c.usageErr(err.Error())
	}
	return c.chat(ctx, ref, o.statePath)
}

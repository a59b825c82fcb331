package claudecode

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	json "github.com/go-json-experiment/json/v1"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// DefaultTenant is the tenant Options uses when none is set.
const DefaultTenant = importer.DefaultTenant

// DefaultMaxLineBytes is the longest transcript line read, in bytes (64
// MiB). Claude Code writes a tool result of hundreds of KiB on one line.
const DefaultMaxLineBytes = importer.DefaultMaxLineBytes

// SourcePrefix starts the envelope source of converted events when
// Options.Source is empty: "urn:claude-code:<session token>".
const SourcePrefix = "urn:claude-code:"

// Options sets how transcripts are converted (tenant, source, line
// limit): the importers' shared importer.Options.
type Options = importer.Options

// Session kinds, as in events.SessionStarted.Kind.
const (
	KindMain       = importer.KindMain
	KindSubagent   = importer.KindSubagent
	KindCompaction = importer.KindCompaction
)

// Session is one converted session: the events of one transcript file, or
// of one subagent whose records an older Claude Code (1.0.x) wrote inline in
// its parent's file (see importer.Session).
//
// Session is the session token: the records' sessionId for a main
// transcript, "<parent>_agent-<agentId>" for a subagent or compaction
// transcript (agentId from the records, else from the file name
// agent-<agentId>.jsonl; for an inline subagent, the uuid of its first
// record). Kind is KindMain, KindSubagent or KindCompaction; Parent and
// ParentToolUseID link a sidechain to its parent session and the Task
// tool_use that started it (empty when unknown).
type Session = importer.Session

// Result is what converting one transcript file produced: its sessions
// (the main or sidechain session first, then subagents written inline),
// the problems found (each line skipped), the number of records read
// (lines that parsed), and the records that produce no event, counted by
// type ("progress", "file-history-snapshot", "system/turn_duration", ...).
type Result = importer.Result

// Converter converts Claude Code transcripts to Turnstone events. It
// remembers, from each main transcript it converts, which Task tool call
// ran which subagent, so that a subagent transcript converted later gets
// its session.started parent_tool_use_id: convert parents before their
// sidechains (Expand orders them so). A Converter is not safe for
// concurrent use.
type Converter struct {
	opts  Options
	links map[string]*parentLinks
}

// parentLinks is what a main transcript tells about its subagents.
type parentLinks struct {
	byAgent  map[string]string // agentId -> Task tool_use id
	tasks    []taskCall        // Task tool calls, in order
	assigned map[string]string // tool_use id -> the subagent session it is linked to
}

// taskCall is a Task (or Agent) tool_use: the subagent's prompt and type.
type taskCall struct {
	id, prompt, subagentType string
}

func (p *parentLinks) task(id string) (taskCall, bool) {
	for _, t := range p.tasks {
		if t.id == id {
			return t, true
		}
	}
	return taskCall{}, false
}

// byPrompt returns the first Task call whose prompt is prompt, not yet
// linked to a subagent session other than token.
func (p *parentLinks) byPrompt(prompt, token string) (taskCall, bool) {
	if prompt == "" {
		return taskCall{}, false
	}
	for _, t := range p.tasks {
		if t.prompt == prompt && (p.assigned[t.id] == "" || p.assigned[t.id] == token) {
			return t, true
		}
	}
	return taskCall{}, false
}

// NewConverter returns a Converter for opts. It returns an error wrapping
// ErrInvalidOptions when opts.Validate fails.
func NewConverter(opts Options) (*Converter, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.SetDefaults()
	return &Converter{opts: opts, links: map[string]*parentLinks{}}, nil
}

var _ importer.Converter = (*Converter)(nil)

// ConvertFile converts the transcript at path, as history, with a new
// Converter (so a subagent transcript is not linked to its parent's tool
// call; see Converter). See Converter.ConvertFile.
func ConvertFile(path string, opts Options) (*Result, error) {
	c, err := NewConverter(opts)
	if err != nil {
		return nil, err
	}
	return c.ConvertFile(path)
}

// Convert converts the transcript read from r, as history, with a new
// Converter. See Converter.Convert.
func Convert(r io.Reader, name string, opts Options) (*Result, error) {
	c, err := NewConverter(opts)
	if err != nil {
		return nil, err
	}
	return c.Convert(r, name, importer.Input{})
}

// ConvertFile converts the transcript at path (one file; its subagents'
// files are converted separately, see Expand) as history, with nothing
// stored before. It returns an error only when the file cannot be opened
// or read; problems with its content are Diagnostics in the Result. See
// Convert for the agent meta file.
func (c *Converter) ConvertFile(path string) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("convert transcript: %w", err)
	}
	defer f.Close()
	return c.Convert(f, path, importer.Input{})
}

// agentMeta is what a subagent's .meta.json says (Claude Code 2.1).
type agentMeta struct {
	AgentType string `json:"agentType"`
}

// readAgentMeta reads the .meta.json beside a subagent transcript, or
// returns the zero agentMeta.
func readAgentMeta(path string) agentMeta {
	var m agentMeta
	if !strings.HasPrefix(filepath.Base(path), "agent-") || !strings.HasSuffix(path, ".jsonl") {
		return m
	}
	b, err := os.ReadFile(strings.TrimSuffix(path, ".jsonl") + ".meta.json")
	if err != nil || len(b) > 64<<10 || json.Unmarshal(b, &m) != nil {
		return agentMeta{}
	}
	m.AgentType = clip(strings.TrimSpace(m.AgentType), 100)
	return m
}

// Convert converts one transcript read from r (importer.Converter). path
// is the transcript's file name or path: diagnostics carry it, a base name
// agent-*.jsonl marks a subagent (sidechain) transcript, as do records
// with isSidechain and agentId, and for a subagent transcript
// agent-<id>.jsonl the agent-<id>.meta.json Claude Code 2.1 writes beside
// it gives the subagent_type label (its agentType) when the Task call did
// not (a meta file that is missing or unreadable is ignored). in.Live reads
// the file as one Claude Code is still writing (see "Live transcripts and cut files" in
// the package documentation); in.Stored lets a response recorded in pieces
// before continue.
//
// It returns an error only when reading r or in.Stored fails; a malformed
// or too long line is a Diagnostic and is skipped, and every other record
// is converted. It never panics on any input.
func (c *Converter) Convert(r io.Reader, path string, in importer.Input) (*Result, error) {
	res := importer.NewResult()
	var recs []*record
	lr := importer.NewLineReader(r, c.opts.MaxLineBytes)
	for n := 1; ; n++ {
		line, tooLong, ok, err := lr.Next()
		if err != nil {
			return nil, fmt.Errorf("convert transcript %s: read line %d: %w", path, n, err)
		}
		if !ok {
			break
		}
		if tooLong {
			res.Diagnostics = append(res.Diagnostics, Diagnostic{File: path, Line: n,
				Err: fmt.Errorf("%w: more than %d bytes", ErrLineTooLong, c.opts.MaxLineBytes)})
			continue
		}
		rec, err := parseRecord(line)
		if err != nil {
			res.Diagnostics = append(res.Diagnostics, Diagnostic{File: path, Line: n, Err: err})
			continue
		}
		rec.line = n
		res.Records++
		if !rec.history() {
			res.Skipped[rec.typ]++
		}
		recs = append(recs, rec)
	}
	if err := c.convertRecords(path, recs, res, readAgentMeta(path), in); err != nil {
		return nil, fmt.Errorf("convert transcript %s: %w", path, err)
	}
	return res, nil
}

// bucket is the records of one session, in file order.
type bucket struct {
	token, kind, parent, agentID string
	recs                         []*record
}

// convertRecords splits a file's records into sessions and converts each.
func (c *Converter) convertRecords(name string, recs []*record, res *Result, meta agentMeta, in importer.Input) error {
	var hist []*record
	for _, r := range recs {
		if r.history() {
			hist = append(hist, r)
		}
	}
	sessionID := ""
	for _, r := range hist {
		if r.sessionID != "" {
			sessionID = r.sessionID
			break
		}
	}
	base := filepath.Base(name)
	stem := strings.TrimSuffix(base, filepath.Ext(base))
	if sessionID == "" {
		sessionID = stem
	}
	parentToken := token(sessionID)

	var buckets []*bucket
	if agentID, ok := sidechainFile(stem, hist); ok {
		kind := KindSubagent
		if strings.HasPrefix(agentID, "acompact") {
			kind = KindCompaction
		}
		buckets = append(buckets, &bucket{
			token: sidechainToken(parentToken, agentID), kind: kind,
			parent: parentToken, agentID: agentID, recs: hist,
		})
	} else {
		main := &bucket{token: parentToken, kind: KindMain}
		buckets = append(buckets, main)
		groups := map[string]*bucket{} // group key -> bucket
		groupOf := map[string]string{} // sidechain record uuid -> group key
		for _, r := range hist {
			if !r.sidechain {
				main.recs = append(main.recs, r)
				continue
			}
			key := r.agentID
			if key == "" {
				key = groupOf[r.parentUUID]
			}
			if key == "" {
				key = r.uuid
			}
			if r.uuid != "" {
				groupOf[r.uuid] = key
			}
			b := groups[key]
			if b == nil {
				b = &bucket{token: sidechainToken(parentToken, key), kind: KindSubagent,
					parent: parentToken, agentID: key}
				groups[key] = b
				buckets = append(buckets, b)
			}
			b.recs = append(b.recs, r)
		}
		c.learnLinks(parentToken, main.recs, recs)
	}

	for _, b := range buckets {
		if len(b.recs) == 0 {
			continue
		}
		s := Session{Tenant: c.opts.Tenant, Session: b.token, File: name, Kind: b.kind, Parent: b.parent}
		var labels map[string]string
		taskPrompt := ""
		if b.kind != KindMain {
			labels = map[string]string{"agent_id": b.agentID}
			if l := c.links[b.parent]; l != nil && b.kind == KindSubagent {
				t, ok := taskCall{}, false
				if id := l.byAgent[b.agentID]; id != "" {
					t, ok = l.task(id)
					if !ok {
						t, ok = taskCall{id: id}, true
					}
				}
				if !ok {
					t, ok = l.byPrompt(firstPrompt(b.recs), b.token)
				}
				if ok && (l.assigned[t.id] == "" || l.assigned[t.id] == b.token) {
					l.assigned[t.id] = b.token
					s.ParentToolUseID = t.id
					taskPrompt = t.prompt
					if t.subagentType != "" {
						labels["subagent_type"] = t.subagentType
					}
				}
			}
		}
		if b.kind == KindSubagent && labels["subagent_type"] == "" && meta.AgentType != "" {
			labels["subagent_type"] = meta.AgentType
		}
		sc := newSessionConv(c, &s, b.recs, res, in)
		sc.taskPrompt = taskPrompt
		sc.run(labels)
		if err := sc.em.Err(); err != nil {
			return err
		}
		if len(s.Events) > 0 {
			res.Sessions = append(res.Sessions, s)
		}
	}
	return nil
}

// sidechainFile reports whether a file holds one subagent's transcript
// (Claude Code 2.x writes them as agent-<agentId>.jsonl, in
// <session>/subagents/ since 2.1) and returns its agent id: the records'
// agentId, else the file name's.
func sidechainFile(stem string, hist []*record) (string, bool) {
	fromName := strings.HasPrefix(stem, "agent-")
	for _, r := range hist {
		if r.typ == recSystem {
			continue
		}
		if r.agentID != "" && (fromName || r.sidechain) {
			return r.agentID, true
		}
		break
	}
	if fromName {
		return strings.TrimPrefix(stem, "agent-"), true
	}
	return "", false
}

// learnLinks records which Task tool call ran which subagent, from a main
// session's records: Task tool_use blocks (prompt, subagent_type),
// progress records of type agent_progress (agentId, parentToolUseID) and
// Task results whose toolUseResult names an agentId.
func (c *Converter) learnLinks(parent string, hist, all []*record) {
	l := c.links[parent]
	if l == nil {
		l = &parentLinks{byAgent: map[string]string{}, assigned: map[string]string{}}
		c.links[parent] = l
	}
	for _, r := range hist {
		for i := range r.blocks {
			b := &r.blocks[i]
			switch {
			case b.Type == events.BlockToolUse && (b.Name == "Task" || b.Name == "Agent"):
				var in struct {
					Prompt       string `json:"prompt"`
					SubagentType string `json:"subagent_type"`
				}
				_ = json.Unmarshal(b.Input, &in)
				if _, dup := l.task(b.ID); !dup {
					l.tasks = append(l.tasks, taskCall{id: b.ID, prompt: in.Prompt, subagentType: in.SubagentType})
				}
			case b.Type == events.BlockToolResult && r.toolResult != nil:
				if a := toolResultAgentID(r.toolResult); a != "" {
					l.byAgent[a] = b.ToolUseID
				}
			}
		}
	}
	for _, r := range all {
		if p := r.progress; p != nil {
			if _, seen := l.byAgent[p.Data.AgentID]; !seen {
				l.byAgent[p.Data.AgentID] = p.ParentToolUseID
			}
		}
	}
}

// firstPrompt is the text of a session's first prompt record.
func firstPrompt(recs []*record) string {
	for _, r := range recs {
		if r.typ == recUser && r.class == classPrompt {
			return r.text
		}
	}
	return ""
}

// sidechainToken is a subagent session's token, "<parent>_agent-<id>",
// made a valid subject token.
func sidechainToken(parent, agentID string) string {
	return token(parent + "_agent-" + agentID)
}

// token makes s a valid subject token (importer.Token).
func token(s string) string { return importer.Token(s) }

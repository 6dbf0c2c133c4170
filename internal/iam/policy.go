package iam

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"cloud.google.com/go/iam/apiv1/iampb"
	"google.golang.org/protobuf/encoding/protojson"
)

// Members that name no one principal.
const (
	AllUsers              = "allUsers"              // every caller, authenticated or not
	AllAuthenticatedUsers = "allAuthenticatedUsers" // every authenticated caller
)

// validMember reports what is wrong with a policy member, or nil:
// user:ID, serviceAccount:ID, domain:DOMAIN, allUsers or
// allAuthenticatedUsers. Groups are refused, not kept: the sidecar has no
// directory to tell their members, and a group that silently granted
// nothing would look like a grant that works. Workload identity pools,
// deleted members and the like are refused too.
func validMember(m string) error {
	if m == AllUsers || m == AllAuthenticatedUsers {
		return nil
	}
	kind, id, ok := strings.Cut(m, ":")
	if !ok || id == "" || strings.TrimSpace(id) != id {
		return fmt.Errorf("member %q is not supported: %s", m, supportedMembers)
	}
	switch kind {
	case "user", "serviceAccount":
		return nil
	case "domain":
		if strings.ContainsAny(id, "@/ \t") {
			return fmt.Errorf("member %q: want domain:DOMAIN, a domain name such as example.com", m)
		}
		return nil
	case "group":
		return fmt.Errorf("member %q is not supported: the sidecar has no directory to resolve a group's members; grant them as user:ID or serviceAccount:ID", m)
	}
	return fmt.Errorf("member %q is not supported: %s", m, supportedMembers)
}

const supportedMembers = "use user:ID, serviceAccount:ID, domain:DOMAIN, " + AllUsers + " or " + AllAuthenticatedUsers

// validPrincipal checks a principal a credential names (a token file's
// line, a certificate): user:ID or serviceAccount:ID.
func validPrincipal(p string) error {
	if kind, _, _ := strings.Cut(p, ":"); kind != "user" && kind != "serviceAccount" {
		if validMember(p) == nil {
			return fmt.Errorf("principal %q: a credential names one user:ID or serviceAccount:ID", p)
		}
	}
	return validMember(p)
}

// domainMember is the member that grants to every principal whose email
// address is in the principal's domain: domain:DOMAIN, DOMAIN in lower
// case; "" for a principal without an address (user:alice,
// serviceAccount:system:serviceaccount:NS:NAME). The domain is the
// address's after its last @, matched whole and without case: a domain
// member grants nothing in its subdomains (user:x@sub.example.com is not
// in domain:example.com), as the sidecar cannot know which of them belong
// to the same organization.
func domainMember(principal string) string {
	kind, id, _ := strings.Cut(principal, ":")
	if kind != "user" && kind != "serviceAccount" {
		return ""
	}
	i := strings.LastIndexByte(id, '@')
	if i < 0 || i == len(id)-1 {
		return ""
	}
	return "domain:" + strings.ToLower(id[i+1:])
}

// validateBindings checks a policy's bindings: known roles, supported
// members, no conditions.
func validateBindings(bs []*iampb.Binding) error {
	for _, b := range bs {
		if _, ok := Roles[b.GetRole()]; !ok {
			return fmt.Errorf("role %q is not supported: the roles are %s", b.GetRole(), roleNames())
		}
		if b.GetCondition() != nil {
			return fmt.Errorf("binding of %s: conditions are not supported", b.GetRole())
		}
		if len(b.GetMembers()) == 0 {
			return fmt.Errorf("binding of %s has no members", b.GetRole())
		}
		for _, m := range b.GetMembers() {
			if err := validMember(m); err != nil {
				return fmt.Errorf("binding of %s: %w", b.GetRole(), err)
			}
		}
	}
	return nil
}

// grants is a policy compiled for lookups: permission → members granted it.
type grants map[string]map[string]struct{}

func compile(bs []*iampb.Binding) grants {
	g := grants{}
	for _, b := range bs {
		for _, p := range Roles[b.GetRole()] {
			if g[p] == nil {
				g[p] = map[string]struct{}{}
			}
			for _, m := range b.GetMembers() {
				if d, ok := strings.CutPrefix(m, "domain:"); ok {
					m = "domain:" + strings.ToLower(d) // matched without case
				}
				g[p][m] = struct{}{}
			}
		}
	}
	return g
}

// allows reports whether g grants perm to principal ("" for a caller
// without credentials).
func (g grants) allows(perm, principal string) bool {
	ms := g[perm]
	if ms == nil {
		return false
	}
	if _, ok := ms[AllUsers]; ok {
		return true
	}
	if principal == "" {
		return false
	}
	if _, ok := ms[AllAuthenticatedUsers]; ok {
		return true
	}
	if _, ok := ms[principal]; ok {
		return true
	}
	if d := domainMember(principal); d != "" {
		_, ok := ms[d]
		return ok
	}
	return false
}

// ProjectPolicy is the project-level policy of --iam-policy: Google's
// Policy JSON, whose bindings hold in every project, and, as jetorder's
// extension, "projects": {"ID": Policy, …} with bindings for one project
// each.
type ProjectPolicy struct {
	every    grants
	projects map[string]grants
}

// DefaultProjectPolicy is the policy without --iam-policy: every
// authenticated caller is roles/pubsub.admin in every project, as a token
// guards a Dapr sidecar's API.
func DefaultProjectPolicy() *ProjectPolicy {
	p, err := ParseProjectPolicy([]byte(`{"bindings":[{"role":"roles/pubsub.admin","members":["allAuthenticatedUsers"]}]}`))
	if err != nil {
		panic(err)
	}
	return p
}

// LoadProjectPolicy reads a project-level policy file.
func LoadProjectPolicy(path string) (*ProjectPolicy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := ParseProjectPolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParseProjectPolicy parses a project-level policy (see ProjectPolicy).
// Unknown roles, unsupported members and conditions are errors.
func ParseProjectPolicy(data []byte) (*ProjectPolicy, error) {
	var file struct {
		Projects map[string]json.RawMessage `json:"projects"`
	}
	top := map[string]json.RawMessage{}
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("not a policy: %w", err)
	}
	if raw, ok := top["projects"]; ok {
		if err := json.Unmarshal(raw, &file.Projects); err != nil {
			return nil, fmt.Errorf(`"projects": want an object of project IDs to policies: %w`, err)
		}
		delete(top, "projects")
	}
	rest, _ := json.Marshal(top)
	every, err := parsePolicy(rest)
	if err != nil {
		return nil, err
	}
	p := &ProjectPolicy{every: compile(every.GetBindings()), projects: map[string]grants{}}
	for id, raw := range file.Projects {
		pp, err := parsePolicy(raw)
		if err != nil {
			return nil, fmt.Errorf("project %s: %w", id, err)
		}
		p.projects[id] = compile(pp.GetBindings())
	}
	return p, nil
}

// parsePolicy reads one Policy in Google's JSON form and validates it.
func parsePolicy(data []byte) (*iampb.Policy, error) {
	pol := &iampb.Policy{}
	if err := protojson.Unmarshal(bytes.TrimSpace(data), pol); err != nil {
		return nil, fmt.Errorf("not a Policy: %w", err)
	}
	if len(pol.GetAuditConfigs()) > 0 {
		return nil, fmt.Errorf("auditConfigs are not supported")
	}
	if err := validateBindings(pol.GetBindings()); err != nil {
		return nil, err
	}
	return pol, nil
}

// allows reports whether the policy grants perm in project to principal.
func (p *ProjectPolicy) allows(project, perm, principal string) bool {
	if p.every.allows(perm, principal) {
		return true
	}
	return p.projects[project].allows(perm, principal)
}

// allowsEverywhere reports whether the bindings for every project grant
// perm to principal: what sidecar-wide pages (/metrics) need.
func (p *ProjectPolicy) allowsEverywhere(perm, principal string) bool {
	return p.every.allows(perm, principal)
}

// anyProject reports whether principal holds perm in some project (for
// every project, or in one of the file's projects).
func (p *ProjectPolicy) anyProject(perm, principal string) bool {
	if p.every.allows(perm, principal) {
		return true
	}
	for _, g := range p.projects {
		if g.allows(perm, principal) {
			return true
		}
	}
	return false
}

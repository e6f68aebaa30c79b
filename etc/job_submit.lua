--[[
slurm-horus job_submit.lua: turn a job's predicted GPU use (a "horus:" hint in
its --comment, written by hsubmit) into a GRES shard request, so that Slurm can
co-pack jobs whose predicted utilization and memory fit together on one GPU.

Written for Lua 5.1 (what Debian's slurmctld links); also fine on 5.2..5.4.
Admin-facing description: docs/hint-and-policy.md.  Policy: horus_policy.conf
next to this file (or the file named by the HORUS_POLICY environment variable).

It also enforces the site's trust policy on jobs that try to share a GPU
without being costed: raw shard requests (raw_shards) and users or accounts
with a record of under-claiming (the record file written by horus-admin sync).

Rules this file keeps:
  * a job without a hint and without a shard request is never touched (no field
    is even written);
  * files are read with a size bound and never waited on (no locks, no retries);
  * every loop and every string it parses is bounded before it is parsed;
  * user text is never used as a Lua pattern and never echoed back;
  * any internal error leaves the job exactly as submitted (pcall + plan/apply);
  * it never makes a valid job invalid: it adds only node features the policy declares
    (type_features) and writes only GRES types the policy knows (gpu.<type>.mem_mib);
    where the typing it would choose is not declared, the job stays as submitted.
]]

-- Limits of the hint format (must match slurm_horus/slurm/hint.py).
local MAX_COMMENT = 65536     -- a comment longer than this holding "horus:" is a bad hint
local MAX_TOKEN = 600         -- hint token length
local MAX_TYPES = 16          -- GPU types in one hint
local MAX_TYPE_LEN = 32       -- gres type name length
local MAX_MEM_MIB = 99999999  -- largest memory value in a hint (MiB)
local MAX_GRES_LEN = 1024     -- Slurm's limit on tres_per_* and --constraint: longer ones are
                              -- left alone, and never written (see over_slurm_limit)
local MAX_GRES_ITEMS = 32
local MAX_POLICY_BYTES = 65536
local MAX_POLICY_LINES = 1000
local MAX_RECORD_BYTES = 65536  -- claim record: only the first 64 KiB are read
local MAX_RECORD_LINE = 256

-- Built-in policy: used for every key the policy file does not set validly.
-- No GPU types are known by default, so without a policy file nothing is packed.
local DEFAULTS = {
	shards_per_gpu = 100,
	pack_limit_pct = 90,
	exclusive_util_milli = 70000,  -- exclusive_util_pct = 70, in 1/1000 %
	memory = "p90",
	min_shards = 1,
	on_bad_hint = "ignore",
	type_via = "features",
	type_choice = "order",
	raw_shards = "allow",          -- shard request without a valid hint: allow | whole | refuse
	min_mem_mib = 512,             -- hint memory below this is costed as this
	record_file = "/var/lib/slurm-horus/record",
	underclaim_limit = 3,          -- under-claims that send a user/account to whole GPUs; 0 = off
	underclaim_window_days = 30,   -- used by horus-admin sync (the hook only validates it)
	pressure_file = "",            -- written by horus-admin queue; "" = off (see load_pressure)
	pressure_shards = 50,          -- shards a job kept whole for util gets under queue pressure
	pressure_max_age_s = 180,      -- an older pressure file is stale: no pressure
	admin_uids = { [0] = true },   -- whose job updates pass unlooked-at (root always; add SlurmUser, operators)
	pack_heavy = "pressure",       -- pressure: heavy jobs share on types under pressure only;
	--                                always: on every type (Slurm's LL_SHARED_GRES spreads them)
	-- slowdown_bound (default 2) and slowdown_tail (default median): horus-admin queue's;
	-- they reach the hook as the pressure file's util_limit_milli
}

-- Policy keys that take a whole number: {lowest, highest, what to say when it is not one}.
local INTEGER_KEYS = {
	shards_per_gpu = { 1, 10000, "need an integer 1..10000" },
	pack_limit_pct = { 1, 100, "need an integer 1..100" },
	min_shards = { 1, math.huge, "need an integer >= 1" },
	min_mem_mib = { 0, MAX_MEM_MIB, "need an integer MiB" },
	pressure_shards = { 1, 1000000, "need an integer 1..shards_per_gpu" },
	pressure_max_age_s = { 1, 86400, "need an integer 1..86400 (seconds)" },
	underclaim_limit = { 0, 1000000, "need an integer 0..1000000" },
	underclaim_window_days = { 1, 36500, "need an integer 1..36500" },
}

-- A policy path: absolute, no control characters, at most 1000 bytes.
local function absolute_path(val)
	return #val <= 1000 and string.find(val, "^/[^%c]*$") ~= nil
end

-- Where this file lives: the policy file is looked for next to it.
local HOOK_DIR = "."
do
	local info = debug.getinfo(1, "S")
	local src = info and info.source
	if type(src) == "string" and string.sub(src, 1, 1) == "@" then
		HOOK_DIR = string.match(string.sub(src, 2), "^(.*)/[^/]*$") or "."
	end
end

-------------------------------------------------------------------------------
-- Small helpers
-------------------------------------------------------------------------------

local function log_info(msg) slurm.log_info("%s", msg) end
local function log_error(msg) slurm.log_error("%s", msg) end
-- slurm.log_user runs string.format: never pass text as the format itself.
local function tell_user(msg) slurm.log_user("%s", msg) end

-- Log a line once per distinct text (bounded memory).
local logged, logged_count = {}, 0
local function log_once(msg)
	if logged[msg] then return end
	if logged_count >= 64 then logged, logged_count = {}, 0 end
	logged[msg] = true
	logged_count = logged_count + 1
	log_info(msg)
end

-- ceil(a / b) for non-negative integers below 2^53 (exact, no rounding).
local function ceil_div(a, b)
	local q = math.floor(a / b)
	if q * b < a then q = q + 1 end
	return q
end

-- Parse a plain non-negative decimal ("45", "45.25") scaled by 10^digits and
-- rounded UP (so a prediction is never understated).  Anything else
-- ("1e3", "-1", "nan", "inf", "0x10", " 5") gives nil.
local function decimal_up(s, digits)
	if type(s) ~= "string" or #s > 19 then return nil end
	local i, f = string.match(s, "^(%d+)%.(%d+)$")
	if not i then
		i, f = string.match(s, "^(%d+)$"), ""
	end
	if not i or #i > 9 or #f > 9 then return nil end
	-- integer arithmetic on Lua 5.3+ too ("^" gives a float there, and a shard count of 50.0
	-- would reach the job's GRES as "shard:50.0")
	local scale = 1
	for _ = 1, digits do scale = scale * 10 end
	local v = tonumber(i) * scale
	if digits > 0 then
		v = v + tonumber(string.sub(f .. string.rep("0", digits), 1, digits))
	end
	if string.find(string.sub(f, digits + 1), "[1-9]") then v = v + 1 end
	return v
end

-- a GRES count as Slurm reads it: digits, whatever number type Lua 5.1-5.4 computed it in
local function count(n)
	return string.format("%d", math.floor(n + 0.5))
end

-- 45200 (milli-percent) -> "45.2"
local function fmt_milli(m)
	local s = string.format("%d.%03d", math.floor(m / 1000), m % 1000)
	s = string.gsub(s, "0+$", "")
	s = string.gsub(s, "%.$", "")
	return s
end

local function is_gtype(s)
	return type(s) == "string" and #s >= 1 and #s <= MAX_TYPE_LEN
		and string.find(s, "^[a-z0-9_%-]+$") ~= nil
end

-- A string field the job sets (nil or blanks: not set).
local function nonempty(s)
	return type(s) == "string" and string.find(s, "%S") ~= nil
end

-- Slurm reports unset numbers as NO_VAL (or nil here); treat those as unset.
local function is_set_number(v)
	return type(v) == "number" and v ~= slurm.NO_VAL and v ~= slurm.NO_VAL16
		and v ~= slurm.NO_VAL64 and v ~= 4294967294 and v ~= 65534
end

-- May this node list (--nodelist, a Slurm hostlist) name more than one node?  Conservative:
-- a ",", a blank (Slurm splits at both) or a "[..]" other than one number ("gpu-[03]" is one
-- node, "gpu-[1-2]" and "gpu-[1,3]" are several) is read as several; so is an unusually long one.
-- Slurm takes every node of the list, raising the job's node count to match.
local function names_several_nodes(rn)
	if type(rn) ~= "string" then return false end
	if #rn > 1024 or string.find(rn, "[,%s]") then return true end
	if not string.find(rn, "[", 1, true) then return false end
	return string.find((string.gsub(rn, "%[%d+%]", "")), "[%[%]]") ~= nil
end

-------------------------------------------------------------------------------
-- Policy file
-------------------------------------------------------------------------------

local policy_cache = { path = nil, text = nil, policy = nil }

local function policy_path()
	local p = os.getenv("HORUS_POLICY")
	if p and p ~= "" then return p end
	return HOOK_DIR .. "/horus_policy.conf"
end

-- Parse the policy text; returns the policy table and a list of warnings.
local function parse_policy(text)
	local pol, warn = {}, {}
	for k, v in pairs(DEFAULTS) do pol[k] = v end
	local gpus, order, tfeat = {}, nil, nil
	local function bad(key, why) warn[#warn + 1] = "policy: " .. key .. ": " .. why .. ", line ignored (an earlier valid line of the key, else its default, stays)" end
	-- a value of plain digits within lo..hi, else nil
	local function whole_in(v, lo, hi)
		local n = string.find(v, "^%d+$") and decimal_up(v, 0)
		if n and n >= lo and n <= hi then return n end
		return nil
	end

	-- raw_shards given (validly or not), and lines the hook cannot take at all: with the latter
	-- and not the former the file is a mistake, and it fails closed (raw_shards = whole below)
	local raw_given, mistaken = false, false
	local nlines, pos, len = 0, 1, #text
	while pos <= len do
		-- a line ends at LF, CRLF or a lone CR (a file saved with old Mac line ends)
		local nl = string.find(text, "[\r\n]", pos)
		local line = string.sub(text, pos, (nl or (len + 1)) - 1)
		if nl and string.byte(text, nl) == 13 and string.byte(text, nl + 1) == 10 then nl = nl + 1 end
		pos = (nl or len) + 1
		nlines = nlines + 1
		if nlines > MAX_POLICY_LINES then
			-- what the rest says (a raw_shards line, perhaps) is unknown: a mistake
			warn[#warn + 1] = "policy: more than 1000 lines, rest ignored"
			mistaken = true
			break
		end
		line = string.gsub(line, "#.*$", "")
		if #line > 1024 then
			warn[#warn + 1] = "policy: line " .. nlines .. " too long, ignored"
			if string.find(line, "%S") then mistaken = true end  -- unread, like an unreadable line
		elseif string.find(line, "%S") then
			local key, val = string.match(line, "^%s*([%w_%.%-]+)%s*=%s*(.-)%s*$")
			if not key then
				mistaken = true
				warn[#warn + 1] = "policy: unreadable line " .. nlines
			elseif INTEGER_KEYS[key] then
				local range = INTEGER_KEYS[key]
				local n = whole_in(val, range[1], range[2])
				if n then pol[key] = n
				else bad(key, range[3]) end
			elseif key == "exclusive_util_pct" then
				local n = decimal_up(val, 3)
				if n and n <= 100000 then pol.exclusive_util_milli = n
				else bad(key, "need a number 0..100") end
			elseif key == "memory" then
				if val == "p90" or val == "p95" or val == "p99" or val == "expected" then pol.memory = val
				else bad(key, "need expected, p90, p95 or p99") end
			elseif key == "on_bad_hint" then
				if val == "ignore" or val == "reject" then pol.on_bad_hint = val
				else bad(key, "need ignore or reject") end
			elseif key == "type_via" then
				if val == "features" or val == "gres" then pol.type_via = val
				else bad(key, "need features or gres") end
			elseif key == "type_choice" then
				if val == "order" or val == "any" then pol.type_choice = val
				else bad(key, "need order or any") end
			elseif key == "raw_shards" then
				raw_given = true
				if val == "allow" or val == "whole" or val == "refuse" then pol.raw_shards = val
				else  -- fail closed: a mistyped value never lets uncosted shards through
					pol.raw_shards = "whole"
					warn[#warn + 1] = "policy: raw_shards: need allow, whole or refuse, whole used"
				end
			elseif key == "record_file" then
				if absolute_path(val) then pol.record_file = val
				else bad(key, "need an absolute path") end
			elseif key == "pressure_file" then
				if val == "" or absolute_path(val) then pol.pressure_file = val
				else bad(key, "need an absolute path, or nothing (off)") end
			elseif key == "admin_uids" then
				local ids, ok = { [0] = true }, string.find(val, "^[%d,%s]+$") ~= nil
				for id in string.gmatch(val, "%d+") do
					-- up to 10 digits (directory uids like 1862400001), below NO_VAL: exact doubles
					local n = #id <= 10 and tonumber(id)
					if n and n <= 4294967294 then ids[n] = true else ok = false end
				end
				if ok then pol.admin_uids = ids
				else bad(key, "need numeric user ids, comma-separated") end
			elseif key == "pack_heavy" then
				if val == "pressure" or val == "always" then pol.pack_heavy = val
				else bad(key, "need pressure or always") end
			elseif key == "slowdown_bound" then
				-- used by horus-admin queue (pack_util_limit); the hook only validates it
				local n = decimal_up(val, 3)
				if not (n and n >= 1000 and n <= 10000) then bad(key, "need a number 1..10") end
			elseif key == "slowdown_tail" then
				-- used by horus-admin queue (pack_util_limit); the hook only validates it
				if not (val == "median" or val == "p90" or val == "p95" or val == "p99") then
					bad(key, "need median, p90, p95 or p99")
				end
			elseif key == "type_features" then
				tfeat = {}
				for name in string.gmatch(val, "[^,%s]+") do
					if #tfeat >= MAX_TYPES then
						warn[#warn + 1] = "policy: type_features: more than 16 types, rest ignored"
						break
					end
					if is_gtype(name) then tfeat[#tfeat + 1] = name
					else warn[#warn + 1] = "policy: type_features: bad type name ignored" end
				end
			elseif key == "type_order" then
				order = {}
				for name in string.gmatch(val, "[^,%s]+") do
					if #order >= MAX_TYPES then break end
					if is_gtype(name) then order[#order + 1] = name
					else warn[#warn + 1] = "policy: type_order: bad type name ignored" end
				end
			else
				local gt = string.match(key, "^gpu%.(.+)%.mem_mib$")
				if gt then
					local n = whole_in(val, 1, MAX_MEM_MIB)
					if not is_gtype(gt) then
						warn[#warn + 1] = "policy: " .. key .. ": bad type name, ignored"
					elseif n then
						gpus[gt] = n
					else
						warn[#warn + 1] = "policy: " .. key .. ": need an integer MiB, type ignored"
					end
				else
					mistaken = true
					warn[#warn + 1] = "policy: unknown key " .. key .. " ignored"
				end
			end
		end
	end
	if mistaken and not raw_given then
		-- a misspelt "raw_shards" (or its line unreadable) must not leave uncosted shards allowed
		pol.raw_shards = "whole"
		warn[#warn + 1] = "policy: lines the hook cannot read and no raw_shards line: raw_shards = whole"
	end
	if pol.min_shards > pol.shards_per_gpu then
		bad("min_shards", "larger than shards_per_gpu")
		pol.min_shards = DEFAULTS.min_shards
	end
	if pol.pressure_shards > pol.shards_per_gpu then
		bad("pressure_shards", "larger than shards_per_gpu")
		pol.pressure_shards = math.min(DEFAULTS.pressure_shards, pol.shards_per_gpu)
	end

	-- type_order: only types with a known memory; default: all types by memory size.
	local final = {}
	if order then
		for _, t in ipairs(order) do
			if gpus[t] then final[#final + 1] = t
			else warn[#warn + 1] = "policy: type_order: " .. t .. " has no gpu." .. t .. ".mem_mib, ignored" end
		end
	else
		for t in pairs(gpus) do final[#final + 1] = t end
		table.sort(final, function(a, b)
			if gpus[a] ~= gpus[b] then return gpus[a] < gpus[b] end
			return a < b
		end)
	end
	-- type_features: the node features that exist, one per GPU type (a feature type_via =
	-- features may add); not set: none.  The hook cannot see the nodes: the policy says.
	local declared = {}
	if tfeat then
		for _, t in ipairs(tfeat) do
			if gpus[t] then declared[t] = true
			else warn[#warn + 1] = "policy: type_features: " .. t .. " has no gpu." .. t .. ".mem_mib, ignored" end
		end
	elseif pol.type_via == "features" and #final > 0 then
		warn[#warn + 1] = "policy: type_features not set: no node feature is declared, so type_via = features" ..
			" pins no job to a GPU type (list the types whose nodes carry Features=<type>)"
	end
	pol.gpus, pol.type_order, pol.type_features = gpus, final, declared
	return pol, warn
end

-- The built-in defaults; ``closed``: a policy file is there but cannot be used, so raw shard
-- requests become whole GPUs instead of passing uncosted (a missing file: the hook is off).
local function builtin_policy(closed)
	local pol = parse_policy("")
	if closed then pol.raw_shards = "whole" end
	return pol
end

-- Read the policy (re-read at each submission; parsed again only when the text changes).
local function load_policy()
	local path = policy_path()
	local f, _, errno = io.open(path, "r")
	if not f then
		if errno == 2 then  -- ENOENT: no policy, the hook is off
			log_once("horus: policy file " .. path .. " not readable, using built-in defaults (no GPU types: nothing is packed)")
			return builtin_policy()
		end
		log_once("horus: policy file " .. path .. " cannot be opened, using built-in defaults with raw_shards = whole")
		return builtin_policy(true)
	end
	local text, err = f:read(MAX_POLICY_BYTES + 1)
	f:close()
	if text == nil and err == nil then text = "" end  -- an empty file: the defaults
	if type(text) ~= "string" then  -- a directory, or a read error
		log_once("horus: policy file " .. path .. " cannot be read, using built-in defaults with raw_shards = whole")
		return builtin_policy(true)
	end
	if #text > MAX_POLICY_BYTES then
		log_once("horus: policy file " .. path .. " larger than 64 KiB, using built-in defaults with raw_shards = whole")
		return builtin_policy(true)
	end
	if string.sub(text, 1, 3) == "\239\187\191" then text = string.sub(text, 4) end  -- a UTF-8 BOM
	if policy_cache.path == path and policy_cache.text == text then
		return policy_cache.policy
	end
	local pol, warn = parse_policy(text)
	for _, w in ipairs(warn) do log_once("horus: " .. path .. ": " .. w) end
	policy_cache.path, policy_cache.text, policy_cache.policy = path, text, pol
	return pol
end

-------------------------------------------------------------------------------
-- Claim record (written by horus-admin sync):
--   user <uid> <name> <under_claims> <jobs_with_claims>
--   account - <name> <under_claims> <jobs_with_claims>
-- Read only when a job would share a GPU; at most 64 KiB; a missing or garbled
-- file (or line) is skipped, never an error.
-------------------------------------------------------------------------------

local record_cache = { path = nil, text = nil, users = nil, accounts = nil }

local function record_name_ok(s)
	return #s <= 64 and string.find(s, "^[%w_%.%-@]+$") ~= nil
end

local function parse_record(text, path)
	local users, accounts, garbled = {}, {}, 0
	local pos, len = 1, #text
	while pos <= len do
		local nl = string.find(text, "\n", pos, true)
		local line = string.sub(text, pos, (nl or (len + 1)) - 1)
		pos = (nl or len) + 1
		if #line > MAX_RECORD_LINE then
			garbled = garbled + 1
		elseif not string.find(line, "^%s*#") and string.find(line, "%S") then
			local kind, id, name, uc, nj = string.match(line,
				"^%s*(%a+)%s+(%S+)%s+(%S+)%s+(%d+)%s+(%d+)%s*$")
			if kind == "user" and string.find(id, "^%d+$") and #id <= 10 and #uc <= 9 and #nj <= 9 then
				local uid, n = tonumber(id), tonumber(uc)
				local old = users[uid]
				if not old or n > old.uc then
					users[uid] = { uc = n, jobs = tonumber(nj), name = record_name_ok(name) and name or nil }
				end
			elseif kind == "account" and id == "-" and record_name_ok(name) and #uc <= 9 and #nj <= 9 then
				local key, n = string.lower(name), tonumber(uc)
				local old = accounts[key]
				if not old or n > old.uc then accounts[key] = { uc = n, jobs = tonumber(nj), name = name } end
			else
				garbled = garbled + 1
			end
		end
	end
	if garbled > 0 then
		log_once("horus: record " .. path .. ": " .. garbled .. " unreadable line(s) skipped")
	end
	return users, accounts
end

-- The record's entries, or nil when there is no usable record.
local function load_record(path)
	local f = io.open(path, "r")
	if not f then
		log_once("horus: record " .. path .. " not readable: the under-claim limit applies to no one")
		return nil
	end
	local ok, text = pcall(f.read, f, MAX_RECORD_BYTES + 1)
	pcall(f.close, f)
	if not ok or type(text) ~= "string" then
		log_once("horus: record " .. path .. " unreadable: the under-claim limit applies to no one")
		return nil
	end
	if #text > MAX_RECORD_BYTES then
		log_once("horus: record " .. path .. " larger than 64 KiB: only its first 64 KiB are read")
		text = string.sub(text, 1, MAX_RECORD_BYTES)
		text = string.match(text, "^(.*)\n") or ""  -- drop the cut last line
	end
	if record_cache.path ~= path or record_cache.text ~= text then
		local users, accounts = parse_record(text, path)
		record_cache.path, record_cache.text = path, text
		record_cache.users, record_cache.accounts = users, accounts
	end
	return record_cache
end

-- Why the job must not share a GPU (its user's or account's record), or nil.
local function record_verdict(pol, job, uid)
	local limit = pol.underclaim_limit
	if limit == 0 then return nil end
	local rec = load_record(pol.record_file)
	if not rec then return nil end
	local u = type(uid) == "number" and rec.users[uid]
	if u and u.uc >= limit then
		return string.format("claim record: user %s has %d under-claims in %d jobs, limit %d",
			u.name and (u.name .. string.format(" (uid %d)", uid)) or string.format("uid %d", uid),
			u.uc, u.jobs, limit)
	end
	-- slurmctld fills in the user's default account only after this hook: without -A, the
	-- account the job will run under is its default_account
	local acct = job.account
	if not nonempty(acct) then acct = job.default_account end
	if type(acct) == "string" and acct ~= "" and #acct <= 64 then
		local a = rec.accounts[string.lower(acct)]
		if a and a.uc >= limit then
			return string.format("claim record: account %s has %d under-claims in %d jobs, limit %d",
				a.name, a.uc, a.jobs, limit)
		end
	end
	return nil
end

-------------------------------------------------------------------------------
-- Hint: find and parse "horus:v1;<type>=<util>/<mem>/<mem_p90>[/<mem_p95>[/<mem_p99>]];..."
-------------------------------------------------------------------------------

local function is_space(c)
	return c == " " or c == "\t" or c == "\n" or c == "\r" or c == "\v" or c == "\f"
end

-- Returns: token (string) | nil, and an error text when a hint is present but bad.
-- (nil, nil) means there is no hint at all.
local function find_hint(comment)
	if type(comment) ~= "string" then return nil, nil end
	if not string.find(comment, "horus:", 1, true) then return nil, nil end
	if #comment > MAX_COMMENT then return nil, "comment longer than 65536 bytes" end
	-- A hint token starts with "horus:" at the start of the comment or after whitespace.
	local start, count, init = nil, 0, 1
	while init <= #comment do  -- at most #comment/6 rounds
		local p = string.find(comment, "horus:", init, true)
		if not p then break end
		if p == 1 or is_space(string.sub(comment, p - 1, p - 1)) then
			count, start = count + 1, p
		end
		init = p + 6
	end
	if count == 0 then return nil, nil end
	if count > 1 then return nil, "more than one horus: token" end
	local stop = string.find(comment, "[ \t\n\r\v\f]", start)
	local tok = string.sub(comment, start, stop and (stop - 1) or #comment)
	return tok, nil
end

-- Parse a token into { [gtype] = {util_milli=, mem=, p90=, p95=, p99=} } (p95, p99: nil
-- when the entry lacks them), or nil and a reason.
local function parse_hint(tok)
	if #tok > MAX_TOKEN then return nil, "hint longer than 600 characters" end
	if string.sub(tok, 1, 9) ~= "horus:v1;" then
		if string.find(tok, "^horus:v%d+;") then return nil, "unsupported hint version" end
		return nil, "malformed hint header"
	end
	local body = string.sub(tok, 10)
	if body == "" then return nil, "hint lists no GPU type" end
	local preds, n, pos = {}, 0, 1
	while true do
		local semi = string.find(body, ";", pos, true)
		local entry = string.sub(body, pos, semi and (semi - 1) or #body)
		n = n + 1
		if n > MAX_TYPES then return nil, "hint lists more than 16 GPU types" end
		local g, us, ms, ps, s95, s99 = string.match(entry,
			"^([a-z0-9_%-]+)=([^/]+)/([^/]+)/([^/]+)/([^/]+)/([^/]+)$")
		if not g then
			g, us, ms, ps, s95 = string.match(entry, "^([a-z0-9_%-]+)=([^/]+)/([^/]+)/([^/]+)/([^/]+)$")
		end
		if not g then
			g, us, ms, ps = string.match(entry, "^([a-z0-9_%-]+)=([^/]+)/([^/]+)/([^/]+)$")
		end
		if not g then return nil, "malformed entry #" .. n end
		if #g > MAX_TYPE_LEN then return nil, "GPU type name too long in entry #" .. n end
		if preds[g] then return nil, "GPU type repeated in entry #" .. n end
		local u, m, p = decimal_up(us, 3), decimal_up(ms, 0), decimal_up(ps, 0)
		if not u or u > 100000 then return nil, "bad utilization in entry #" .. n end
		if not m or m > MAX_MEM_MIB then return nil, "bad memory in entry #" .. n end
		if not p or p > MAX_MEM_MIB then return nil, "bad p90 memory in entry #" .. n end
		local p95, p99 = s95 and decimal_up(s95, 0), s99 and decimal_up(s99, 0)
		if s95 and (not p95 or p95 > MAX_MEM_MIB) then return nil, "bad p95 memory in entry #" .. n end
		if s99 and (not p99 or p99 > MAX_MEM_MIB) then return nil, "bad p99 memory in entry #" .. n end
		preds[g] = { util_milli = u, mem = m, p90 = p, p95 = p95, p99 = p99 }
		if not semi then break end
		pos = semi + 1
	end
	return preds, nil
end

-------------------------------------------------------------------------------
-- GPU request: find exactly one GPU on one node in tres_per_node / tres_per_job
-------------------------------------------------------------------------------

-- Split "gres:gpu:a100:1,gres:nvme:1" into entries; nil if unusually long.
local function split_list(s)
	if s == nil or s == "" then return {} end
	if type(s) ~= "string" or #s > MAX_GRES_LEN then return nil end
	local items = {}
	for item in string.gmatch(s, "[^,]+") do
		if #items >= MAX_GRES_ITEMS then return nil end
		items[#items + 1] = item
	end
	return items
end

-- The GRES name of a request item as slurmctld reads it (case and all), or nil: the name after
-- the item's first "gres", wherever it stands (slurm_get_next_tres: "xgres/shard:1" and
-- "gresshard:1" ask for shards), past one "/" or ":"; an item without "gres" by its first word.
-- Blanks and repeated gres:/gres/ prefixes are passed over, in case Slurm does too (an item the
-- hook cannot name is no shard request).
local function entry_name(item)
	local rest = item
	local g = string.find(item, "gres", 1, true)
	if g then rest = string.gsub(string.sub(item, g + 4), "^[/:]", "") end
	for _ = 1, 8 do
		rest = string.gsub(rest, "^%s+", "")
		local head = string.sub(rest, 1, 5)
		if head ~= "gres:" and head ~= "gres/" then break end
		rest = string.sub(rest, 6)
	end
	return string.match(rest, "^([%w_%-%.]+)")
end

-- Parse one entry. Returns {prefix=, name=, gtype=, count=} or nil if unreadable.
-- prefix keeps the spelling: "gres:" (<= 23.02), "gres/" (>= 23.11) or "".
local function parse_entry(e)
	local prefix, rest = "", e
	local head = string.sub(e, 1, 5)
	if head == "gres:" or head == "gres/" then prefix, rest = head, string.sub(e, 6) end
	local name, tail = string.match(rest, "^([%w_%-%.]+)(.*)$")
	if not name then return nil end
	local r = { prefix = prefix, name = name }
	if tail == "" then
		r.count = 1
	else
		local a, b = string.match(tail, "^:([^:]+):([^:]+)$")
		if a then
			r.gtype, r.count = a, (string.find(b, "^%d+$") and tonumber(b)) or nil
		else
			a = string.match(tail, "^:([^:]+)$")
			if not a then return nil end
			if string.find(a, "^%d+$") then r.count = tonumber(a)
			elseif string.find(a, "^%d") then return nil  -- "1k": a count with a suffix
			else r.gtype, r.count = a, 1 end
		end
		if not r.count then return nil end
	end
	-- an item Slurm reads another GRES in ("xgresshard:4": 4 shards) is one the hook cannot read
	if entry_name(e) ~= name then return nil end
	return r
end

local function mentions_gpu(s)
	return type(s) == "string" and (string.find(s, "gpu", 1, true) ~= nil)
end

-- srun's long options that ask for GPUs, and those that do when their value names gpu; getopt
-- takes any unique prefix of a long option ("--cpus-per-g", "--gpus-per-t"), so a prefix of
-- one of these is read as it (an ambiguous prefix, "--cpus-per-", makes srun fail anyway).
-- Exact option names win in getopt: --mem and --ntasks are prefixes of --mem-per-gpu and
-- --ntasks-per-gpu but no GPU request.
-- --gpu-bind (any value, none too): Slurm 25.11 gives such a step of a job on shards no GPU
-- (CUDA_VISIBLE_DEVICES empty, seen on the local cluster); so does --tres-bind=gres/gpu:...,
-- which step_gpu_option reads as any --tres... option naming gpu
local SRUN_GPU_LONG = { "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "cpus-per-gpu",
	"mem-per-gpu", "ntasks-per-gpu", "gpu-bind" }
local SRUN_GPU_VALUE_LONG = { "gres", "tres-per-task" }
local SRUN_EXACT_NOT_GPU = { mem = true, ntasks = true }

-- srun's one-letter options that take a value (the rest of the word, or the next word); the
-- others are flags here (-k and -I, whose optional value is the rest of the word, too: a G
-- after them is taken for -G, which at worst keeps a job whole)
local SRUN_SHORT_WITH_VALUE = "ABCDFGJLMNSTWbcdeimnopqrtwx"

local function is_prefix(p, s)
	return #p <= #s and string.sub(s, 1, #p) == p
end

-- A bundle of one-letter options ("-lG1" is -l -G 1): read as getopt does, left to right up to
-- the first letter that takes a value (the rest of the word is that value).  Returns whether it
-- asks for GPUs (-G) and whether it takes the next word as its value (a value letter last).
local function short_bundle(name)
	for i = 2, math.min(#name, 64) do
		local c = string.sub(name, i, i)
		if c == "G" then return true, i == #name end
		if string.find(SRUN_SHORT_WITH_VALUE, c, 1, true) then return false, i == #name end
	end
	return false, false
end

-- Is this srun option (name, its value or nil) a GPU request of the step?  --gpus*,
-- -G (bundled too: -lG1), --cpus-per-gpu and the like, a --gres or --tres-per-task naming
-- gpu (long options as getopt takes them, abbreviated too)
local function step_gpu_option(name, value)
	if string.sub(name, 1, 6) == "--gpus" or string.find(name, "^%-%-[%w%-]*per%-gpu") then
		return true
	end
	if string.sub(name, 1, 2) ~= "--" then return (short_bundle(name)) end  -- -G, -G1, -lG1
	local long = string.sub(name, 3)
	if long ~= "" and not SRUN_EXACT_NOT_GPU[long] then
		for _, o in ipairs(SRUN_GPU_LONG) do
			if is_prefix(long, o) then return true end
		end
		if value ~= nil and mentions_gpu(value) then
			for _, o in ipairs(SRUN_GPU_VALUE_LONG) do
				if is_prefix(long, o) then return true end
			end
		end
	end
	if string.sub(name, 1, 5) == "--gre" or string.sub(name, 1, 6) == "--tres" then
		return value ~= nil and mentions_gpu(value)
	end
	return false
end

-- srun's options that take no value (the next word is the program, not their value)
local SRUN_FLAGS = {}
for _, o in ipairs({ "--label", "--unbuffered", "--verbose", "--quiet", "--kill-on-bad-exit",
	"--disable-status", "--no-allocate", "--preserve-env", "--no-kill", "--overcommit", "--hold",
	"--oversubscribe", "--exclusive", "--pty", "--overlap", "--exact", "--multi-prog", "--contiguous",
	"--spread-job", "--test-only", "--whole", "--x11", "--use-min-nodes", "--quit-on-interrupt",
	"--immediate", "--reboot", "--send-libs", "--help", "--usage", "--version" }) do
	SRUN_FLAGS[o] = true
end

-- Does srun take the next word as this option's value (an option written without "=")?
local function takes_value(name)
	if string.sub(name, 1, 2) == "--" then return not SRUN_FLAGS[name] end
	-- -n 4 and -ln 4 take one; -n4, -lu (a value attached, or flags only) and -l do not
	local _, next_word = short_bundle(name)
	return next_word
end

-- Do srun's own options on this command line (after the word srun, up to the program it
-- runs) ask for GPUs?  A word after an option that takes a value is read as its value.
local function srun_asks_for_gpus(rest)
	rest = string.match(rest, "^[^;&|]*")  -- one command: up to ; & | && ||
	local pending
	for w in string.gmatch(rest, "%S+") do
		w = string.gsub(w, "[\"']", "")
		if w == "--" then return false end
		if string.sub(w, 1, 1) == "-" then
			local name, value = string.match(w, "^([^=]+)=(.*)$")
			name = name or w
			if step_gpu_option(name, value) then return true end
			if value == nil and takes_value(name) then pending = name else pending = nil end
		elseif pending then
			if step_gpu_option(pending, w) then return true end
			pending = nil
		else
			return false  -- the program srun runs: the rest are its own arguments
		end
	end
	return false
end

-- The script is read at most this far for srun: srun words looked at, and the bytes after
-- each read for its options (a hostile script must not stall slurmctld: every step is
-- bounded, and the script is walked once)
local MAX_SRUN_WORDS = 1000
local SRUN_WINDOW = 512

-- A step that asks for GPUs by name (srun --gres=gpu:1, --gpus=1, -G 1, --cpus-per-gpu ...)
-- finds no gpu GRES in a job on shards and fails ("Invalid generic resource (gres)
-- specification"): does the batch script (--wrap's too) run one?  Only srun lines of the
-- script itself are seen (the first MAX_SRUN_WORDS), not a program that starts srun.
local function steps_ask_for_gpus(script)
	if type(script) ~= "string" then return false end
	local pos, line_start, comment = 1, 1, nil
	for _ = 1, MAX_SRUN_WORDS do
		local s, e = string.find(script, "srun", pos, true)
		if not s then return false end
		-- the line it is on: the last newline since the previous srun word, found in one
		-- match (a Lua loop over each newline took 1 s on 4 MB of them)
		local nl = string.match(string.sub(script, pos, s - 1), "^.*()\n")
		if nl then line_start, comment = pos + nl, nil end
		pos = e + 1
		if comment == nil then comment = string.find(script, "^[ \t]*#", line_start) ~= nil end
		local before, after = string.sub(script, s - 1, s - 1), string.sub(script, e + 1, e + 1)
		-- a quoted command word ("srun" --gres=gpu:1, "$dir/srun" ...) is srun to the shell
		if after == '"' or after == "'" then e = e + 1; after = string.sub(script, e + 1, e + 1) end
		-- the command word srun (or a path to it), not a part of another word, on no comment line
		if not comment and (before == "" or string.find(before, "[%s;&|(`/\"'{]"))
			and (after == "" or string.find(after, "%s")) then
			-- its command, continued lines joined, within the window
			local rest = string.gsub(string.sub(script, e + 1, e + SRUN_WINDOW), "\\\r?\n", " ")
			if srun_asks_for_gpus(string.match(rest, "^[^\n]*")) then return true end
		end
	end
	return false
end

-- srun reads these from the job's environment as its own GPU options: sbatch puts SLURM_GPUS
-- and SLURM_GPUS_PER_NODE there for --gpus and --gpus-per-node, and a job submitted from inside
-- another job carries that job's; a step asking for GPUs fails in a job on shards, and one
-- binding them (SLURM_GPU_BIND: srun's --gpu-bind) runs without its GPU
local STEP_GPU_ENV = { "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_SOCKET", "SLURM_GPUS_PER_TASK",
	"SLURM_CPUS_PER_GPU", "SLURM_MEM_PER_GPU", "SLURM_NTASKS_PER_GPU", "SLURM_GPU_BIND" }

-- Does the job's environment make its srun steps ask for GPUs?  (slurmctld's job_desc gives
-- the environment as a table read by variable name)  srun also reads each variable with the
-- suffix _HET_GROUP_<n> (and the older _PACK_GROUP_<n>) of the het group it runs in, 0 without
-- --het-group: sbatch writes a het job's options that way (SLURM_GPUS_PER_NODE_HET_GROUP_0)
local function env_asks_for_gpus(job)
	local env = job.environment
	if type(env) ~= "table" then return false end
	local suffixes = { "", "_HET_GROUP_0", "_PACK_GROUP_0" }
	local off = job.het_job_offset
	if is_set_number(off) and off > 0 and off < 128 and off == math.floor(off) then
		suffixes[4] = string.format("_HET_GROUP_%d", off)
		suffixes[5] = string.format("_PACK_GROUP_%d", off)
	end
	for _, sfx in ipairs(suffixes) do
		for _, name in ipairs(STEP_GPU_ENV) do
			if nonempty(env[name .. sfx]) then return true end
		end
		if mentions_gpu(env["SLURM_GRES" .. sfx]) or mentions_gpu(env["SLURM_TRES_PER_TASK" .. sfx])
			or mentions_gpu(env["SLURM_TRES_BIND" .. sfx]) then
			return true
		end
	end
	return false
end

-- Find the job's single-GPU request. Returns a request table or nil and a reason.
-- request = { field = "tres_per_node"|"tres_per_job", items = {...}, index = i, entry = parsed }
local function find_gpu_request(job)
	local found, gpus = nil, 0
	for _, field in ipairs({ "tres_per_node", "tres_per_job" }) do
		local items = split_list(job[field])
		if not items then return nil, "unusual " .. field .. " string" end
		for i, item in ipairs(items) do
			local e = parse_entry(item)
			if not e then
				if mentions_gpu(item) then return nil, "unreadable GPU request" end
			elseif (e.name == "shard" or e.name == "mps") and e.count > 0 then
				return nil, "job already asks for shared GPU resources"
			elseif e.name == "gpu" then
				gpus = gpus + e.count
				if e.count > 0 then found = { field = field, items = items, index = i, entry = e } end
			end
		end
	end
	if mentions_gpu(job.tres_per_task) or mentions_gpu(job.tres_per_socket) then
		return nil, "GPUs requested per task or per socket"
	end
	if gpus == 0 then return nil, "no GPU requested" end
	if gpus > 1 then return nil, "multi-GPU request" end
	if is_set_number(job.min_nodes) and job.min_nodes > 1 then return nil, "multi-node job" end
	if is_set_number(job.max_nodes) and job.max_nodes > 1 then return nil, "multi-node job" end
	-- slurmctld raises the node count to the list's: shards on each of its nodes
	if names_several_nodes(job.req_nodes) then return nil, "multi-node job: --nodelist names several nodes" end
	-- one GPU's shards are costed for one node: a job of several tasks may span nodes (Slurm
	-- spreads them where one node lacks the CPUs) unless it is held to one (--nodes=1); a GPU
	-- per node would then be one on each, and shards on every node it spans
	if not (is_set_number(job.max_nodes) and job.max_nodes == 1)
		and is_set_number(job.num_tasks) and job.num_tasks > 1 then
		return nil, "several tasks that may span nodes (--nodes=1 holds them to one)"
	end
	return found, nil
end

-------------------------------------------------------------------------------
-- Shard requests the hook did not compute (raw_shards, claim record)
-------------------------------------------------------------------------------

local TRES_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }

local function mentions_shard(s)
	return type(s) == "string" and (string.find(s, "shard", 1, true) ~= nil)
end

-- Run on every submission (a plain string search first): does the job ask for shards, an
-- entry named shard with a count (or one that cannot be read: whole_gpu_request says why)?
-- "shardfs:1" or "gpu:a100_shard:1" is no shard request.
local function asks_for_shards(job)
	for _, f in ipairs(TRES_FIELDS) do
		local v = job[f]
		if mentions_shard(v) then
			local items = split_list(v)
			if not items then return true end
			for _, item in ipairs(items) do
				local e = parse_entry(item)
				if not e then
					if entry_name(item) == "shard" then return true end
				elseif e.name == "shard" and e.count > 0 then
					return true
				end
			end
		end
	end
	return false
end

-- The whole-GPU equivalent of the job's shard request, as { field = new value }:
-- per node, shard[:<type>]:N becomes gpu[:<type>]:ceil(N / shards_per_gpu) in the
-- same spelling (a job's shards on a node come from one GPU, so N <= shards_per_gpu
-- is one GPU), other GRES kept in place, gpu:0 / shard:0 entries dropped.  Returns (nil, why) when the request
-- cannot be converted, (nil, nil) when it asks for no shard after all (shard:0).
-- Third value: the shard type, if the request named one.
local function whole_gpu_request(job, pol)
	local set, found, gtype, gpus_too, seen = {}, false, nil, false, {}
	for _, field in ipairs(TRES_FIELDS) do
		local items = split_list(job[field])
		if not items then
			if mentions_shard(job[field]) then return nil, "unusual " .. field .. " string" end
		else
			local out, changed = {}, false
			for _, item in ipairs(items) do
				local e = parse_entry(item)
				if not e then
					local name = entry_name(item)
					if name == "shard" or name == "gpu" then return nil, "unreadable GRES request" end
					out[#out + 1] = item
				elseif (e.name == "gpu" or e.name == "shard") and e.count == 0 then
					changed = true  -- asks for nothing
				elseif e.name == "gpu" then
					gpus_too = true  -- a conflict only beside a shard entry with a count
					out[#out + 1] = item
				elseif e.name == "shard" then
					if field ~= "tres_per_node" then return nil, "shards asked per job, task or socket" end
					if e.gtype and not is_gtype(e.gtype) then return nil, "unusual GPU type name in request" end
					local t = e.gtype or ""
					if seen[t] then return nil, "shards of one type asked twice" end
					seen[t] = true
					if e.count > 999999999 then return nil, "unusual shard count" end
					local n = ceil_div(e.count, pol.shards_per_gpu)
					out[#out + 1] = e.prefix .. "gpu:" .. (e.gtype and (e.gtype .. ":") or "") .. string.format("%d", n)
					changed, found, gtype = true, true, gtype or e.gtype
				else
					out[#out + 1] = item
				end
			end
			if changed then set[field] = table.concat(out, ",") end  -- "" clears the field
		end
	end
	if not found then return nil, nil end
	if gpus_too then return nil, "GPUs and shards asked together" end
	if mentions_shard(job.cpus_per_tres) or mentions_shard(job.mem_per_tres) then
		return nil, "CPUs or memory asked per shard"
	end
	return set, nil, gtype
end

-------------------------------------------------------------------------------
-- Queue pressure (written by horus-admin queue every pass):
--   written <unix time>
--   util_limit_milli <n>         highest predicted util that may pack under pressure, 1/1000 %
--                                (the policy's slowdown_bound on the measured curve)
--   pressure <gpu type>          one line per type where a new job would find no idle GPU
-- At most 4 KiB; missing, stale (older than pressure_max_age_s), garbled: no pressure. No
-- util_limit_milli line (a loop older than the slowdown bound): any util may pack.
-- Policy pack_heavy = always: every type counts as under pressure while the file is fresh
-- (Slurm 23.11+'s SelectTypeParameters=LL_SHARED_GRES then puts a shard job on an idle GPU
-- while there is one, beside a partner once there is none); the loop must still run, for the
-- utilization limit and as the sign that it is alive.
-------------------------------------------------------------------------------

local MAX_PRESSURE_BYTES = 4096

-- {types = {gtype = true}, all = bool, code = reason, util_limit_milli = n}: the types under
-- pressure now (none: {}; all: every type, pack_heavy = always) and how far they may pack;
-- never an error.
local function load_pressure(pol)
	local none = { types = {}, util_limit_milli = 0 }
	if pol.pressure_file == "" then return none end
	local f = io.open(pol.pressure_file, "r")
	if not f then return none end
	local ok, text = pcall(f.read, f, MAX_PRESSURE_BYTES + 1)
	pcall(f.close, f)
	if not ok or type(text) ~= "string" or #text > MAX_PRESSURE_BYTES then return none end
	local written = tonumber(string.match(text, "^written (%d+)\n") or "")
	if not written or os.time() - written > pol.pressure_max_age_s or written > os.time() + 60 then
		return none
	end
	local limit = string.match(text, "\nutil_limit_milli (%d+)\n")
	local types = {}
	for t in string.gmatch(text, "\npressure ([%w_%-]+)") do
		if is_gtype(t) then types[t] = true end
	end
	local all = pol.pack_heavy == "always"
	return { types = types, all = all, code = all and "pack_heavy" or "pressure",
		util_limit_milli = limit and #limit <= 9 and tonumber(limit) or math.huge }
end

-------------------------------------------------------------------------------
-- Policy decision for one GPU type
-------------------------------------------------------------------------------

-- kind: "shared" (with shards), "exclusive" (whole GPU) or "nofit" (memory over the limit).
-- pressure: load_pressure's; on a type under pressure (every type: pack_heavy = always), a job
-- within its util_limit_milli (the slowdown bound's) shares: kept whole for its utilization,
-- at pressure_shards, or its memory's share when that is more and less than the whole GPU
-- (horus-admin queue's pack, at submission); shared, asking for no more than pressure_shards
-- for its utilization (its memory's share still), so that any two such jobs may pair, as the
-- simulated horus scheduler pairs under pressure.
-- The types untyped shards (type_choice = any) may land on, each to be costed: type_order's, and
-- every other the hint names (hsubmit names the types of the job's partition; a type only
-- another partition has is in no hint, and must not stop the job sharing where it runs)
local function any_types(pol, preds)
	local out, listed, rest = {}, {}, {}
	for _, t in ipairs(pol.type_order) do out[#out + 1], listed[t] = t, true end
	for t in pairs(preds) do
		if not listed[t] and pol.gpus[t] then rest[#rest + 1] = t end
	end
	table.sort(rest)
	for _, t in ipairs(rest) do out[#out + 1] = t end
	return out
end

local function evaluate(pol, gtype, pred, pressure)
	local S, P, G = pol.shards_per_gpu, pol.pack_limit_pct, pol.gpus[gtype]
	-- memory = p95 / p99: the largest bound the hint gives up to that quantile (a hint without
	-- the p99 is costed at its p95, one without either at its p90), never below a lower bound
	-- the user claimed (the claim audit checks the p90; a hint's bounds come in any order);
	-- field: the highest of those bounds the hint has, as the note names it
	local field, mem = pol.memory, pred.mem
	if field ~= "expected" then
		local want = field
		field, mem = "p90", pred.p90
		if want ~= "p90" and pred.p95 then field, mem = "p95", math.max(mem, pred.p95) end
		if want == "p99" and pred.p99 then field, mem = "p99", math.max(mem, pred.p99) end
	end
	if mem < pol.min_mem_mib then mem = pol.min_mem_mib end  -- a CUDA context alone costs more
	local r = { gtype = gtype, util_milli = pred.util_milli, mem = mem, mem_field = field }
	-- Shares of one GPU measured against the pack limit, rounded up to whole shards:
	--   util share: S * util / P          memory share: S * mem / (G * P / 100)
	local n_util = ceil_div(S * pred.util_milli, P * 1000)
	local n_mem = ceil_div(S * mem * 100, G * P)
	local pressed = pressure and (pressure.all or pressure.types[gtype])
		and pred.util_milli <= pressure.util_limit_milli
	if n_mem > S then
		r.kind, r.code = "nofit", "memory"
		r.why = string.format("memory %d MiB > %d%% of %s's %d MiB", mem, P, gtype, G)
	elseif pred.util_milli >= pol.exclusive_util_milli and pressed and n_mem < S then
		-- its memory's share when that is more than pressure_shards: a partner that fits
		-- beside it is small, which beats waiting for a whole GPU
		r.kind, r.code = "shared", pressure.code
		r.shards = math.max(pol.pressure_shards, n_mem, pol.min_shards)
	elseif pred.util_milli >= pol.exclusive_util_milli then
		r.kind, r.code = "exclusive", "util"
		r.why = string.format("util %s%% >= %s%%", fmt_milli(pred.util_milli), fmt_milli(pol.exclusive_util_milli))
	elseif n_util > S then
		r.kind, r.code = "exclusive", "pack_limit"
		r.why = string.format("util %s%% > pack limit %d%%", fmt_milli(pred.util_milli), P)
	else
		r.kind = "shared"
		r.shards = math.max(n_util, n_mem, pol.min_shards)
		local capped = math.max(pol.pressure_shards, n_mem, pol.min_shards)
		if pressed and capped < r.shards then
			r.shards, r.code = capped, pressure.code
		end
	end
	return r
end

-------------------------------------------------------------------------------
-- Plan: decide what to change (pure: reads job, writes nothing)
-------------------------------------------------------------------------------

-- Existing --constraint: only a plain AND list can take "&<type>".
local function feature_tokens(features)
	if features == nil or features == "" then return {} end
	if type(features) ~= "string" or #features > 1024 then return nil end
	if not string.find(features, "^[%w_%-%.&]+$") then return nil end
	local toks = {}
	for t in string.gmatch(features, "[^&]+") do toks[#toks + 1] = t end
	return toks
end

-- The one place that decides HOW the GPU type of a shard job is enforced.
-- type_via = features: gres "shard:N" + constraint "&<type>" (works on 22.05), only for a
--                      type whose node feature the policy declares (type_features): Slurm
--                      refuses a constraint no node satisfies, so the hook never adds one
--                      it does not know exists;
-- type_via = gres:     gres "shard:<type>:N" (gtype is always a type of gpu.<type>.mem_mib).
local function shard_request(pol, prefix, gtype, shards, features)
	if pol.type_via == "gres" then
		return prefix .. "shard:" .. gtype .. ":" .. count(shards), nil
	end
	local toks = feature_tokens(features)
	if toks == nil then return nil, nil, "cannot add GPU type to a complex --constraint" end
	for _, t in ipairs(toks) do
		if t == gtype then return prefix .. "shard:" .. count(shards), nil end  -- the user's own constraint
	end
	if not pol.type_features[gtype] then
		return nil, nil, "type_via = features, no node feature " .. gtype .. " declared"
	end
	if #toks == 0 then return prefix .. "shard:" .. count(shards), gtype end
	-- Slurm takes a trailing "&" ("ib&" is ib) but refuses "&&": join at the user's last term
	return prefix .. "shard:" .. count(shards), (string.gsub(features, "&+$", "")) .. "&" .. gtype
end

-- Does the plan write a --constraint or tres_per_* string longer than Slurm takes?  slurmctld
-- checks their lengths after this hook (job_mgr.c _test_job_desc_fields) and refuses the job.
local function over_slurm_limit(set)
	for _, f in ipairs({ "features", "tres_per_node", "tres_per_job" }) do
		if type(set[f]) == "string" and #set[f] > MAX_GRES_LEN then return true end
	end
	return false
end

local TOO_LONG = "the request would grow past Slurm's 1024 characters"

local function unchanged(why)
	return { rc = slurm.SUCCESS, set = {}, note = "horus: unchanged (" .. why .. ")", kind = "unchanged", why = why,
		reason = "not_handled" }
end

local function ignored_hint(herr)
	return { rc = slurm.SUCCESS, set = {}, note = "horus: ignored hint (" .. herr .. ")", kind = "unchanged",
		reason = "bad_hint" }
end

local function rejected(msg)
	return { rc = slurm.ERROR, user = "horus: job rejected: " .. msg }
end

-- The plan for a job with a valid hint (preds).
-- plan = { rc=, set = {field=value}, note=, user=, kind=, why=, gtype=, shards=, reason=, unpressed= }
-- (kind, gtype, shards, reason and unpressed make the decision token, see decision_token)
local function hint_plan(job, pol, uid, preds)

	local req, why = find_gpu_request(job)
	if not req then return unchanged(why) end
	-- no batch script: an srun or salloc allocation, whose own --gres=gpu:1 (srun's step, or
	-- salloc's srun) finds no gpu in a job on shards.  slurmctld's job_desc always has an
	-- environment; a description of an sbatch job (hsubmit --explain, the simulator) may not.
	if not nonempty(job.script) and job.environment ~= nil then
		return unchanged("no batch script: an srun or salloc allocation keeps its GPU; sbatch (hsubmit) jobs share")
	end
	-- --gpus: sbatch puts SLURM_GPUS in the job's environment, which each srun step reads
	if req.field == "tres_per_job" then
		return unchanged("--gpus set: its srun steps would ask for GPUs; use --gres=gpu:1 to share")
	end
	-- --exclusive (any kind): Slurm gives the job whole nodes and every GRES on them, which
	-- shards can never be (it would wait forever); as submitted it runs
	if is_set_number(job.shared) and job.shared ~= 1 then return unchanged("--exclusive set") end
	if mentions_gpu(job.cpus_per_tres) or mentions_gpu(job.mem_per_tres) then
		return unchanged("--cpus-per-gpu/--mem-per-gpu set")
	end
	if is_set_number(job.ntasks_per_tres) and job.ntasks_per_tres > 0 then
		return unchanged("--ntasks-per-gpu set")
	end
	-- Slurm refuses a GPU frequency for a job that holds no gpu GRES
	if mentions_gpu(job.tres_freq) then return unchanged("--gpu-freq set") end
	-- Slurm 25.11 gives the srun steps of a job on shards with a GPU binding no GPU at all
	if mentions_gpu(job.tres_bind) then return unchanged("--gpu-bind (or --tres-bind=gres/gpu) set") end
	if env_asks_for_gpus(job) then
		return unchanged("--gpus-per-node set (or a GPU option in its environment): its srun steps would" ..
			" ask for GPUs; use --gres=gpu:1 to share")
	end
	if steps_ask_for_gpus(job.script) then
		return unchanged("the script's srun steps ask for GPUs by name, which a job on shards has none of")
	end
	if #pol.type_order == 0 then return unchanged("policy knows no GPU types") end

	-- Which type: the one the user asked for (--gres type or a type named in a
	-- plain --constraint), else the policy's preference.
	local toks = feature_tokens(job.features)
	if toks == nil then return unchanged("cannot combine with a complex --constraint") end
	local asked, ftype = req.entry.gtype, nil
	if asked and not is_gtype(asked) then return unchanged("unusual GPU type name in request") end
	for _, t in ipairs(toks) do
		if pol.gpus[t] then
			if ftype and ftype ~= t then return unchanged("--constraint names several GPU types") end
			ftype = t
		end
	end
	if asked and ftype and asked ~= ftype then
		return unchanged("GPU types in --gres and --constraint differ")
	end
	asked = asked or ftype
	-- A type the hook picks itself is ANDed to the user's other constraint terms, and no one
	-- here knows whether any node of that type has them (Slurm refuses a constraint no node
	-- satisfies: a valid job made invalid).  With a type the user named, the terms stay theirs.
	if not asked then
		for _, t in ipairs(toks) do
			if not pol.gpus[t] then
				return unchanged("--constraint names features, not a GPU type")
			end
		end
	end
	local choice
	if asked then
		if not pol.gpus[asked] then return unchanged("policy does not know type " .. asked) end
		if not preds[asked] then return unchanged("hint has no prediction for " .. asked) end
		choice = evaluate(pol, asked, preds[asked])
		if choice.kind == "nofit" then choice.kind = "exclusive" end  -- user's type is kept, whole GPU
	else
		-- type_choice = any: a job that can share every type the policy knows asks for the
		-- largest of its per-type shard counts with no type, so Slurm may place it on any of
		-- them (it fits the policy on each); otherwise the first type in type_order is pinned.
		-- A job that needs a whole GPU of every type (and fits each) keeps its untyped
		-- request, so it too may start wherever a GPU frees up.
		if pol.type_choice == "any" then
			local worst, whole, fits, n_shared = nil, nil, true, 0
			-- untyped shards may land on any type the job's partition has (those the hint
			-- names): each must be one the policy costs, and the job fit each, as on every
			-- type of type_order (any_types)
			for t in pairs(preds) do
				if not pol.gpus[t] then fits = false end
			end
			for _, t in ipairs(fits and any_types(pol, preds) or {}) do
				local r = preds[t] and evaluate(pol, t, preds[t])
				if not r or r.kind == "nofit" then fits = false break end
				if r.kind == "exclusive" then whole = whole or r
				else
					n_shared = n_shared + 1
					if not worst or r.shards > worst.shards then worst = r end
				end
			end
			if fits and whole and n_shared == 0 then
				choice = { kind = "exclusive", any = true, gtype = whole.gtype, why = whole.why, code = whole.code }
			elseif fits and worst and not whole then
				choice = { kind = "shared", any = true, gtype = worst.gtype, shards = worst.shards,
					util_milli = worst.util_milli, mem = worst.mem, mem_field = worst.mem_field,
					code = worst.code }
			end
		end
		local exclusive
		for _, t in ipairs(choice and {} or pol.type_order) do
			if preds[t] then
				local r = evaluate(pol, t, preds[t])
				if r.kind == "shared" then choice = r break end
				if r.kind == "exclusive" and not exclusive then exclusive = r end
			end
		end
		choice = choice or exclusive
		if not choice then return unchanged("no GPU type fits the prediction") end
		-- a type the hook pins must be one the nodes the job names (or leaves) have, and no
		-- one here knows theirs: untyped requests stay valid wherever the job may run
		if not choice.any and (nonempty(job.req_nodes) or nonempty(job.exc_nodes)) then
			return unchanged("--nodelist/--exclude set: the hook does not know those nodes' GPU types")
		end
	end
	-- On a type horus-admin queue sees under pressure (a new job finds no idle GPU; with
	-- pack_heavy = always, any type while the loop's file is fresh), a job within the slowdown
	-- bound's utilization limit: kept whole for its utilization, it shares at pressure_shards
	-- (or its memory's share) instead; shared, it asks for at most pressure_shards for its
	-- utilization (evaluate).  What it would have had without the pressure goes in its token
	-- (unpressed), which is what horus-admin queue gives it back once the pressure is gone.
	if (choice.kind == "exclusive" and choice.code == "util")
			or (choice.kind == "shared" and choice.shards > pol.pressure_shards) then
		local pressure = load_pressure(pol)
		local unpressed = choice.kind == "exclusive" and "gpu" or choice.shards
		if not choice.any then
			if pressure.all or pressure.types[choice.gtype] then
				local r = evaluate(pol, choice.gtype, preds[choice.gtype], pressure)
				if r.kind == "shared" then choice = r end
			end
		else
			-- a job of no type (type_choice = any; on a one-type site every job) waits for
			-- whichever type frees first: it packs when every type is pressed and it may
			-- share on each, at the most shards any of them needs
			local worst = nil
			for _, t in ipairs(any_types(pol, preds)) do
				local r = preds[t] and (pressure.all or pressure.types[t]) and evaluate(pol, t, preds[t], pressure)
				if not r or r.kind ~= "shared" then worst = nil break end
				if not worst or r.shards > worst.shards then worst = r end
			end
			if worst then
				choice = { kind = "shared", any = true, gtype = worst.gtype, shards = worst.shards,
					util_milli = worst.util_milli, mem = worst.mem, mem_field = worst.mem_field,
					code = worst.code }
			end
		end
		if choice.code == "pressure" or choice.code == "pack_heavy" then choice.unpressed = unpressed end
	end

	-- A user or account with a record of under-claiming does not share: the job
	-- keeps the whole GPU it asked for (of the type it named, if any).
	if choice.kind == "shared" then
		local verdict = record_verdict(pol, job, uid)
		if verdict then
			return { rc = slurm.SUCCESS, set = {}, kind = "exclusive", gtype = asked or "any", reason = "record",
				note = "horus: exclusive " .. (asked or "any") .. " (" .. verdict .. ": whole GPU, no shards)" }
		end
	end

	local e, set = req.entry, {}
	local items = {}
	for i, v in ipairs(req.items) do items[i] = v end

	if choice.kind == "exclusive" then
		local note = "horus: exclusive " .. (choice.any and "any" or choice.gtype) .. " (" ..
			choice.why .. (choice.any and (" on " .. choice.gtype) or "") .. ")"
		if not req.entry.gtype and not choice.any then  -- gres:gpu:1 -> gres:gpu:<type>:1
			items[req.index] = e.prefix .. "gpu:" .. choice.gtype .. ":1"
			set[req.field] = table.concat(items, ",")
		end
		if over_slurm_limit(set) then return unchanged(TOO_LONG) end
		return { rc = slurm.SUCCESS, set = set, note = note, kind = "exclusive",
			gtype = choice.any and "any" or choice.gtype, reason = choice.code }
	end

	-- Shared: the GPU request becomes a shard request in tres_per_node.
	local gres, features, err
	if choice.any then
		gres = e.prefix .. "shard:" .. count(choice.shards)
	else
		gres, features, err = shard_request(pol, e.prefix, choice.gtype, choice.shards, job.features)
	end
	if not gres then return unchanged(err) end
	items[req.index] = gres
	set.tres_per_node = table.concat(items, ",")
	if features then set.features = features end
	-- one node, for good: a later task or CPU count (scontrol update NumTasks=) cannot spread
	-- the job over nodes with shards on each
	set.max_nodes = 1
	-- gpu:0 / shard:0 entries ask for nothing; beside the shards they would only make Slurm
	-- doubt the job (a second shard entry: which count?).
	for _, f in ipairs({ "tres_per_node", "tres_per_job" }) do
		local list = split_list(set[f] or job[f])
		if list then
			local keep, dropped = {}, false
			for _, item in ipairs(list) do
				local pe = parse_entry(item)
				if pe and (pe.name == "gpu" or pe.name == "shard") and pe.count == 0 then dropped = true
				else keep[#keep + 1] = item end
			end
			if dropped then set[f] = table.concat(keep, ",") end
		end
	end
	if over_slurm_limit(set) then return unchanged(TOO_LONG) end
	local note = string.format("horus: shared %s shards=%d/%d (util %s%%, mem %d MiB %s%s%s)",
		choice.any and "any" or choice.gtype, choice.shards, pol.shards_per_gpu,
		fmt_milli(choice.util_milli), choice.mem, choice.mem_field,
		choice.any and (" on " .. choice.gtype .. ", the most of any type") or "",
		choice.code == "pressure" and ("; queue pressure on " .. (choice.any and "every type" or choice.gtype))
			or choice.code == "pack_heavy" and "; pack_heavy = always" or "")
	return { rc = slurm.SUCCESS, set = set, note = note, kind = "shared",
		gtype = choice.any and "any" or choice.gtype, shards = choice.shards, per_gpu = pol.shards_per_gpu,
		reason = choice.code, unpressed = choice.unpressed }
end

-- The plan for a job that asks for shards itself (conv: its whole-GPU equivalent,
-- or nil and cerr when there is none).  preds: its valid hint, if any.
local function shard_plan(job, pol, uid, preds, herr, conv, cerr, ctype)
	local mode, verdict = pol.raw_shards, nil
	if mode == "allow" then
		verdict = record_verdict(pol, job, uid)
		if not verdict then  -- allowed: as before, the job runs as submitted
			if herr then return ignored_hint(herr) end
			if preds then return unchanged("job already asks for shared GPU resources") end
			return nil
		end
	end
	if not preds then
		if mode == "refuse" and not verdict then
			return rejected("it asks for GPU shards without a valid horus hint (policy raw_shards = refuse)." ..
				" Submit it with hsubmit, or ask for whole GPUs (--gres=gpu:1).")
		end
		if not conv then
			return rejected("its GPU shard request cannot be turned into whole GPUs (" .. cerr .. ")." ..
				" Submit it with hsubmit, or ask for whole GPUs (--gres=gpu:1).")
		end
		local why = verdict or ("shards asked without a valid hint, raw_shards = " .. mode)
		return { rc = slurm.SUCCESS, set = conv, kind = "exclusive", gtype = ctype or "any",
			reason = verdict and "record" or "raw_shards",
			note = "horus: exclusive " .. (ctype or "any") .. " (" .. why .. ": whole GPU, no shards)" }
	end
	-- A valid hint: the shards are costed from it, as for a one-GPU request.
	if not conv then
		return rejected("its GPU shard request cannot be costed from its hint (" .. cerr .. ")." ..
			" Submit it with hsubmit --gres=gpu:1, or ask for whole GPUs.")
	end
	local view = setmetatable({}, { __index = function(_, k)
		if conv[k] ~= nil then return conv[k] end
		return job[k]
	end })
	local plan = hint_plan(view, pol, uid, preds)
	local set = {}
	for k, v in pairs(conv) do set[k] = v end
	for k, v in pairs(plan.set) do set[k] = v end
	if plan.kind == "unchanged" then
		return { rc = slurm.SUCCESS, set = set, kind = "exclusive", gtype = ctype or "any", reason = "raw_shards",
			note = "horus: exclusive " .. (ctype or "any") .. " (shards asked: whole GPU, hint not applied: " ..
				plan.why .. ")" }
	end
	plan.set = set
	return plan
end

-- Build the plan, or nil to leave the job untouched.
local function make_plan(job, pol, uid)
	local tok, herr = find_hint(job.comment)
	local preds
	if tok then preds, herr = parse_hint(tok) end
	if herr and pol.on_bad_hint == "reject" then
		return rejected("bad resource hint in --comment (" .. herr ..
			"). Resubmit with hsubmit, or remove the horus: token from the comment.")
	end
	if asks_for_shards(job) then
		local conv, cerr, ctype = whole_gpu_request(job, pol)
		if conv or cerr then return shard_plan(job, pol, uid, preds, herr, conv, cerr, ctype) end
	end
	if not tok and not herr then return nil end  -- no hint: untouched
	if not preds then return ignored_hint(herr) end
	return hint_plan(job, pol, uid, preds)
end

-------------------------------------------------------------------------------
-- Apply the plan (the only place that writes to job_desc)
-------------------------------------------------------------------------------

local APPLY_ORDER = { "max_nodes", "tres_per_job", "tres_per_task", "tres_per_socket", "tres_per_node", "features" }

-- The machine-readable twin of a plan's note, written after it in AdminComment:
--   horus-decision:v1;action=<shared|exclusive|unchanged>[;type=<gtype|any>][;shards=<n>/<S>][;reason=<code>][;unpressed=<gpu|m>]
-- reason: util, pack_limit, memory, record, raw_shards (exclusive); not_handled, bad_hint
-- (unchanged); pressure, pack_heavy (shared: queue pressure decided the shards), each with
-- unpressed: what the job would have had without the pressure, a whole GPU (gpu, kept whole
-- for its utilization) or m > n shards (its count for its utilization, capped).  Every part
-- is a policy value, a validated type name or a constant, never user text; the hook's token
-- is the last one in AdminComment, so one an admin wrote before it is not taken for the
-- hook's.  Read by slurm_horus.slurm.hint.parse_decision (keep in step).
local function decision_token(plan)
	local t = "horus-decision:v1;action=" .. plan.kind
	if plan.gtype then t = t .. ";type=" .. plan.gtype end
	if plan.shards then t = t .. string.format(";shards=%d/%d", plan.shards, plan.per_gpu) end
	if plan.reason then t = t .. ";reason=" .. plan.reason end
	if plan.unpressed == "gpu" then t = t .. ";unpressed=gpu"
	elseif plan.unpressed then t = t .. string.format(";unpressed=%d", plan.unpressed) end
	return t
end

local function apply_plan(job, plan)
	if plan.note then
		local entry = plan.note .. " " .. decision_token(plan)
		local old = job.admin_comment
		if type(old) == "string" and old ~= "" then plan.set.admin_comment = old .. "; " .. entry
		else plan.set.admin_comment = entry end
	end
	local saved, done = {}, {}
	local ok, err = pcall(function()
		for _, f in ipairs(APPLY_ORDER) do
			if plan.set[f] then saved[f] = job[f] end
		end
		for _, f in ipairs(APPLY_ORDER) do
			if plan.set[f] then job[f] = plan.set[f]; done[#done + 1] = f end
		end
		if plan.set.admin_comment then job.admin_comment = plan.set.admin_comment end
	end)
	if not ok then
		-- Put back what was written so the job stays as submitted.
		for _, f in ipairs(done) do pcall(function() job[f] = saved[f] or "" end) end
		error(err, 0)
	end
end

-------------------------------------------------------------------------------
-- Slurm entry points
-------------------------------------------------------------------------------

function slurm_job_submit(job_desc, part_list, submit_uid)
	local ok, res = pcall(function()
		local comment = job_desc.comment
		-- Fast path: no "horus:" anywhere (no hint) and no shard request -> nothing
		-- is read or written.
		if (type(comment) ~= "string" or not string.find(comment, "horus:", 1, true))
			and not asks_for_shards(job_desc) then
			return slurm.SUCCESS
		end
		local plan = make_plan(job_desc, load_policy(), submit_uid)
		if not plan then return slurm.SUCCESS end
		-- the log names the submitter: a refused job leaves no record of whose it was, and a
		-- job id is given only after this hook
		local by = " (submitted by uid " ..
			(type(submit_uid) == "number" and string.format("%d", submit_uid) or "unknown") .. ")"
		if plan.rc ~= slurm.SUCCESS then
			log_info(plan.user .. by)
			tell_user(plan.user)
			return plan.rc
		end
		log_info(plan.note .. by)
		tell_user(plan.note)
		apply_plan(job_desc, plan)  -- last step: on failure it restores what it wrote
		return slurm.SUCCESS
	end)
	if ok then return res end
	log_error("horus: internal error, job left as submitted: " .. tostring(res))
	return slurm.SUCCESS
end

-- The horus tokens of a comment (the hint, the workload token), in order, as one string.
local function horus_words(comment)
	if type(comment) ~= "string" or not string.find(comment, "horus", 1, true) then return "" end
	if #comment > MAX_COMMENT then return nil end  -- bounded before it is parsed
	local out = {}
	for w in string.gmatch(comment, "%S+") do
		if string.sub(w, 1, 6) == "horus:" or string.sub(w, 1, 10) == "horus-job:" then out[#out + 1] = w end
	end
	return table.concat(out, " ")
end

-- What a user may not change once the hook has decided: the hint it costed (the loop and
-- the claim audit read it) and, for a job on shards, the partition and features that pin
-- its GPU type (its shards were costed for that type's memory) and its one node.
local function frozen_update(job_desc, job_rec)
	if job_desc.comment ~= nil then
		local new, old = horus_words(job_desc.comment), horus_words(job_rec.comment)
		if new == nil or new ~= old then return "a job's horus hint is fixed at submission" end
	end
	if asks_for_shards(job_rec) then
		for _, f in ipairs({ "features", "partition" }) do
			if job_desc[f] ~= nil and job_desc[f] ~= job_rec[f] then
				return "a job on GPU shards keeps the GPU type (" .. f .. ") they were costed for"
			end
		end
		-- its shards were costed as one GPU's share: more nodes would give it shards on each
		for _, f in ipairs({ "min_nodes", "max_nodes" }) do
			if is_set_number(job_desc[f]) and job_desc[f] > 1 then
				return "a job on GPU shards stays on one node"
			end
		end
		-- held to one node (max_nodes = 1), more tasks than the CPUs it holds could leave it
		-- pending for good (BadConstraints): refused, with the reason, instead; as many or
		-- fewer fit where it already fits (the job record has no task count in Lua)
		local cpus = is_set_number(job_rec.min_cpus) and job_rec.min_cpus or 1
		for _, f in ipairs({ "num_tasks", "ntasks_per_node" }) do
			if is_set_number(job_desc[f]) and job_desc[f] > math.max(1, cpus) then
				return "a job on GPU shards keeps to the CPUs of its one node (its shards were costed for one node)"
			end
		end
		-- a node list of several nodes raises the node count with it (Slurm takes them all)
		if names_several_nodes(job_desc.req_nodes) then
			return "a job on GPU shards stays on one node"
		end
	end
	return nil
end

-- An update by a user (root's and admin_uids' pass): one that changes the hint, or the GPU type of a job
-- on shards, is refused; one that asks for shards (scontrol update job=.. Gres=shard:N)
-- gets the same raw_shards / claim record treatment as a submission.  Nothing else is
-- looked at.  Only the GRES fields are written: an AdminComment change by a user would
-- make Slurm deny the whole update.
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	local ok, res = pcall(function()
		if modify_uid == 0 or load_policy().admin_uids[modify_uid] then return slurm.SUCCESS end
		local frozen = job_rec ~= nil and frozen_update(job_desc, job_rec)
		if frozen then
			-- logged only: Slurm before 23.02 takes no user message in job_modify (it logs an error)
			log_info(string.format("horus: update by uid %d refused: %s (cancel and resubmit instead)",
				modify_uid, frozen))
			return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
		end
		if not asks_for_shards(job_desc) then return slurm.SUCCESS end
		local pol = load_policy()
		local conv, cerr = whole_gpu_request(job_desc, pol)
		if not conv and not cerr then return slurm.SUCCESS end
		local verdict
		if pol.raw_shards == "allow" then
			local acct = job_desc.account
			if acct == nil and job_rec ~= nil then acct = job_rec.account end
			-- the owner's record: an operator or account coordinator may update another's job
			local owner = job_rec ~= nil and is_set_number(job_rec.user_id) and job_rec.user_id or modify_uid
			verdict = record_verdict(pol, { account = acct }, owner)
			if not verdict then return slurm.SUCCESS end
		end
		if pol.raw_shards == "refuse" or not conv then
			log_info(string.format("horus: update by uid %d refused: shards asked (%s)", modify_uid,
				conv and "raw_shards = refuse" or cerr))
			return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
		end
		log_info(string.format("horus: update by uid %d: shards asked, whole GPU instead (%s)", modify_uid,
			verdict or "raw_shards = whole"))
		for _, f in ipairs(TRES_FIELDS) do
			if conv[f] then job_desc[f] = conv[f] end
		end
		return slurm.SUCCESS
	end)
	if ok then return res end
	log_error("horus: internal error in job_modify, update left as requested: " .. tostring(res))
	return slurm.SUCCESS
end

return slurm.SUCCESS

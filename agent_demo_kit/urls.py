"""The endpoint's URL, worked out once: the chat-completions URL requests go to and the base URL a
server's other paths hang from, both from what the user gave (a base URL or the full one, a query
kept); how a URL is shown and recorded (no password, no secret query value); and the secrets that
must never be shown.

It imports nothing of agent-demo's.
"""
import functools
import importlib.util
import ipaddress
import re
from typing import Dict, List, Optional, Tuple
from urllib.parse import unquote, urlsplit, urlunsplit

CHAT_PATH = "/chat/completions"


def chat_completions_url(url: str) -> str:
    """Accept a full chat-completions URL or a base URL such as https://host/v1; the query is kept."""
    parts = urlsplit(url.strip())
    return urlunsplit(parts._replace(path=base_path(parts.path) + CHAT_PATH))


def base_url(url: str, query: bool = False) -> str:
    """The base URL a server's other paths hang from (https://host/v1), without the query unless asked."""
    parts = urlsplit(url.strip())
    return urlunsplit(parts._replace(path=base_path(parts.path), query=parts.query if query else ""))


def server_root(url: str) -> str:
    """The server itself: scheme and host, no path (where llama.cpp's /props and Ollama's /api/show are)."""
    return urlunsplit(urlsplit(url.strip())._replace(path="", query=""))


def endpoint_of(url: str) -> str:
    """What names an endpoint in a batch's configuration: its base URL with the port (two local servers on
    one host are two endpoints), without a login, and with the values of its query hidden as when shown."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    plain = parts._replace(netloc=host + port, path=base_path(parts.path), fragment="")
    return urlunsplit(plain._replace(query=_hidden_query(plain.query)[0]))


def base_path(path: str) -> str:
    """A URL's path without /chat/completions and the slash at its end: the one place it is taken off."""
    path = path.rstrip("/")
    return path[:-len(CHAT_PATH)] if path.endswith(CHAT_PATH) else path


# Query parameters known to carry nothing secret, shown as they are; every other value in a URL's
# query is shown and recorded as ***, since a credential may go by any name (?code=, ?sig=, ?jwt=).
_PLAIN_PARAMETERS = {"api-version", "api_version", "version", "v", "model", "deployment", "deployment-id",
                     "format", "stream", "timeout", "region", "location", "lang", "locale", "beta"}


def _hidden_query(query: str) -> "tuple[str, List[str]]":
    """The query with each value but the plain ones as ***, and those values as written."""
    fields_shown, secrets = [], []
    for field_text in re.split(r"([&;])", query):
        name, equals, value = field_text.partition("=")
        if equals and value and unquote(name).strip().lower() not in _PLAIN_PARAMETERS:
            secrets.append(value)
            field_text = f"{name}=***"
        elif not equals and name not in ("", "&", ";") and unquote(name).strip().lower() not in _PLAIN_PARAMETERS:
            secrets.append(name)  # a bare token (?sig...): a credential as much as a value is
            field_text = "***"
        fields_shown.append(field_text)
    return "".join(fields_shown), secrets


def display_url(url: str) -> str:
    """A URL as it may be shown and recorded: its password, query values (but plain ones) and fragment
    become ***; so does all before an @ that urlsplit leaves out of the host (a password with "/")."""
    stray = _stray_userinfo(url)
    if stray is not None:
        url = url.replace(stray + "@", "***@", 1)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not even a URL: hide whatever stands before an @, and every query value
        return re.sub(r"=[^&#]+", "=***", re.sub(r"(://[^/@]*:)[^/@]*@", r"\1***@", url))
    if password is not None:
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{parts.username}:***@{host}")
    return urlunsplit(parts._replace(query=_hidden_query(parts.query)[0], fragment="***" if parts.fragment else ""))


def url_problem(url: str, basic_auth: bool = True) -> Optional[str]:
    """Why requests could not send to this URL, or not to the host it is shown and checked with
    (None: it can); said without the URL, which may hold a password. basic_auth: its user name and
    password are sent (requests sends them as Latin-1, unless a key is sent instead)."""
    url = url.strip()  # as it is sent
    authority = re.split(r"[/?#]", url.partition("://")[2], 1)[0]
    if re.search(r"[\x00-\x20\x7f]", authority):  # in a path or a query, requests escapes them
        return "holds a space or a control character in its host part"
    if _stray_userinfo(url) is not None:
        return ('holds an "@" after where its host ends: a user name or password with "/", "?" or "#" in it'
                " must have them %-escaped (%2F, %3F, %23)")
    try:
        parts = urlsplit(url)
        parts.port  # a port that is not a number raises only when asked for
    except ValueError as error:
        return ("has a port that is not a number from 0 to 65535" if "port" in str(error).lower()
                else "cannot be read as a URL (a bracket left open?)")
    if "\\" in parts.netloc:
        return "holds a backslash in its host part, which requests and this check would read as different hosts"
    host = parts.hostname or ""
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if ":" not in host and (len(host) > 253 or any(not 0 < len(label) <= 63 for label in labels)):
        return "has a host name with an empty part or a part longer than 63 characters"
    try:
        (unquote(parts.username or "") + unquote(parts.password or "")).encode("latin-1" if basic_auth else "utf-8")
    except UnicodeEncodeError:  # beyond Latin-1, or a byte of the environment that is not UTF-8
        return ("holds a user name or password with a character Basic auth cannot send (it goes as Latin-1,"
                " whether written as it is or %-escaped): use an ASCII password")
    return None


def proxy_problem(url: str) -> Optional[str]:
    """What is wrong with the proxy the environment names for this URL (HTTPS_PROXY and the like, unless
    NO_PROXY leaves it out), which requests would find out only on every request; None if nothing is."""
    import requests  # imported here: the proxy that counts is the one requests picks
    proxy = given = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
    if not proxy:
        return None
    which = "the proxy the environment names for this endpoint (HTTP_PROXY, HTTPS_PROXY or ALL_PROXY)"
    try:
        proxy = requests.utils.prepend_scheme_if_needed(proxy, "http")
    except ValueError:  # urllib3 could not read it (a port that is not a number): neither could a request
        problem = url_problem(proxy if "://" in proxy else f"http://{proxy}")
        return f"{which} {problem or 'cannot be read as a URL'}"
    problem = url_problem(proxy)
    if problem:
        return f"{which} {problem}" + ("" if "://" in given else " (it names no scheme: begin it with http://)")
    scheme = urlsplit(proxy).scheme.lower()
    if scheme.startswith("socks"):
        if importlib.util.find_spec("socks") is None:  # PySocks, what requests' SOCKS support needs
            return f"{which} is a SOCKS proxy, which needs PySocks: pip install 'requests[socks]'"
    elif scheme not in ("http", "https"):
        return f"{which} is a {scheme}: URL; requests takes http, https or socks5 proxies"
    return None


def _stray_userinfo(url: str) -> Optional[str]:
    """What stands between "//" and a URL's last @ when urlsplit does not take it for the user name and
    password: one that holds "/", "?" or "#" unescaped (the host urlsplit finds is then the user name, and
    its port the start of the password, which no request can use)."""
    rest = url.partition("://")[2]
    if "@" not in rest:
        return None
    userinfo = rest.rpartition("@")[0]
    try:
        parts = urlsplit(url)
    except ValueError:
        return userinfo
    if "@" in parts.netloc:
        return None  # read as a user name and password already
    try:
        parts.port
    except ValueError:  # "user:pass/word@host": the port urlsplit sees is the password's start
        return userinfo
    return None  # an @ in a path (/@cf/, Smithery's /@user/server), a query or a fragment is theirs


def secrets_of(environment: Dict[str, str], *urls: Optional[str]) -> List[str]:
    """What must never be shown: the keys, and each URL's password and query values (but plain ones),
    as written and as sent (a short query value such as ?page=1 is hidden in the URL, not everywhere)."""
    found = [(environment.get(name) or "").strip() for name in ("LLM_API_KEY", "OPENAI_API_KEY", "LLM_ESCALATE_KEY",
                                                                 "LLM_JUDGE_KEY")]
    for url in (*urls, *(environment.get(name) for name in ("LLM_API_URL", "OPENAI_BASE_URL", "LLM_ESCALATE_URL"))):
        found += _url_secrets(url or "")
    return [secret for secret in found if secret]


def is_http_url(text: str) -> bool:
    """Does an --mcp server (or a --mcp-config "url") name a URL, not a command?"""
    return re.match(r"https?://", text, re.IGNORECASE) is not None


def mcp_urls(servers: List[str]) -> List[str]:
    """The --mcp servers given as URLs (the others are commands), whose secrets are redacted too."""
    return [server for server in servers if is_http_url(server)]


@functools.lru_cache(maxsize=64)  # a batch asks for the same few URLs' task after task
def _url_secrets(url: str) -> Tuple[str, ...]:
    """A URL's password and query values (but plain ones), as written and as sent."""
    url = url.strip()
    stray = _stray_userinfo(url)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return tuple(filter(None, [stray, stray and stray.partition(":")[2]]))
    query_secrets = [value for value in _hidden_query(parts.query)[1] if len(unquote(value)) >= 8]
    found = ([password] if password else []) + query_secrets + ([parts.fragment] if len(parts.fragment) >= 8 else [])
    if stray is not None:
        found += [stray, *filter(None, [stray.partition(":")[2]])]
    return tuple(form for secret in found for form in (secret, unquote(secret)))


def with_v1(url: str) -> str:
    """A base URL with /v1 where the path has none: http://localhost:11434 -> http://localhost:11434/v1."""
    parts = urlsplit(url.strip())
    return urlunsplit(parts._replace(path=base_path(parts.path) + "/v1"))


def is_local(url: str) -> bool:
    """Is the endpoint on this machine or this network (a server the user runs, busy with one request at a time)?"""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".local"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local

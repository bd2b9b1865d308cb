"""The GPU catalog and the price list: data files in the package (gpus.yaml, prices.yaml), validated.

Every card and every price carries its source. Prices keep their own currency; conversion happens only
when the advice is shown, with rates the user can override. A malformed file is refused naming the file,
the line and the field.
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainwise.errors import ConfigError

PLAN_DIR = Path(__file__).parent
GPUS_FILE = PLAN_DIR / "gpus.yaml"
PRICES_FILE = PLAN_DIR / "prices.yaml"
HOURS_PER_MONTH = 730
PCIE4_GBS = 32  # a PCIe 4.0 x16 link per direction, for cards whose file gives no link  # 365 × 24 / 12, the convention cloud price pages use


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Throughput(_Row):
    fp32: float = Field(gt=0, description="Peak dense fp32 TFLOP/s (CUDA cores).")
    tf32: float | None = Field(None, gt=0, description="Peak dense TF32 tensor TFLOP/s; null without TF32.")
    bf16: float | None = Field(None, gt=0, description="Peak dense bf16 tensor TFLOP/s; null without bf16.")
    fp16: float | None = Field(None, gt=0, description="Peak dense fp16 tensor TFLOP/s.")


class Gpu(_Row):
    name: str
    memory_gib: float = Field(gt=0, description="Total memory as nvidia-smi reports it, GiB.")
    tflops: Throughput
    bandwidth_gbs: float = Field(gt=0, description="Memory bandwidth, GB/s.")
    tdp_w: float = Field(gt=0)
    compute_capability: str
    bf16: bool
    interconnect: str = Field("pcie", description="pcie or nvlink: sets the multi-GPU scaling efficiency.")
    link_gbs: float | None = Field(None, gt=0, description="Card-to-card bandwidth per direction, GB/s (None: "
                                   "32, a PCIe 4.0 x16 slot).")
    host_link_gbs: float | None = Field(None, gt=0, description="The card's PCIe link to the host, GB/s (None: 32).")
    source: str = Field(min_length=4)

    @property
    def link_bytes_s(self) -> float:
        return (self.link_gbs or PCIE4_GBS) * 1e9

    @property
    def host_bytes_s(self) -> float:
        return (self.host_link_gbs or PCIE4_GBS) * 1e9

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    def peak_tflops(self, precision: str, tf32: bool = True) -> float:
        """The peak for a precision: bf16 on a card without it runs as fp16 (what `auto` picks)."""
        t = self.tflops
        if precision == "bf16":
            return t.bf16 or t.fp16 or t.fp32
        if precision == "fp16":
            return t.fp16 or t.fp32
        return (t.tf32 if tf32 and t.tf32 else t.fp32)


class Offer(_Row):
    provider: str
    region: str
    instance: str
    gpu: str
    gpus: int = Field(1, ge=1)
    currency: str = Field(min_length=3, max_length=3)
    on_demand_hour: float | None = Field(None, gt=0)
    spot_hour: float | None = Field(None, gt=0)
    month: float | None = Field(None, gt=0)
    source: str = Field(min_length=4)

    @field_validator("currency")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.provider, self.region, self.instance)


class PriceList(BaseModel):
    model_config = ConfigDict(frozen=True)

    as_of: str
    offers: tuple[Offer, ...]
    exchange_rates_usd: dict[str, float]
    sources: tuple[str, ...] = ()


# ---- money: prices keep their currency until shown ------------------------------------------------

def convert(amount: float | None, from_currency: str, to_currency: str, rates: dict[str, float]) -> float | None:
    if amount is None:
        return None
    return amount * rates[from_currency] / rates[to_currency]


def offer_costs(offer: Offer, hours: float, currency: str, rates: dict[str, float]) -> dict:
    """Cost of the job on one offer that takes `hours` on it."""
    on_demand = convert(offer.on_demand_hour, offer.currency, currency, rates)
    spot = convert(offer.spot_hour, offer.currency, currency, rates)
    month = convert(offer.month, offer.currency, currency, rates)
    return {
        "offer": {**offer.model_dump(), "hours": hours},
        "cost_on_demand": hours * on_demand if on_demand else None,
        "cost_spot": hours * spot if spot else None,
        "cost_monthly": math.ceil(hours / HOURS_PER_MONTH) * month if month else None,
        "break_even_hours_per_month": (month / on_demand) if month and on_demand else None,
    }


# ---- loading ------------------------------------------------------------------------------------------

def load_gpus(path: Path = GPUS_FILE) -> tuple[Gpu, ...]:
    raw, lines = _read(path, "gpus")
    gpus = tuple(_validate(Gpu, item, path, "gpus", index, lines) for index, item in enumerate(raw["gpus"]))
    names = [g.name for g in gpus]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ConfigError(f"{path}: card names must be unique; repeated: {', '.join(sorted(duplicates))}.")
    return gpus


def load_prices(extra: Path | None = None, gpus: tuple[Gpu, ...] | None = None) -> PriceList:
    """The packaged prices, replaced or extended by a user's file (rows with the same provider, region and
    instance replace the packaged ones; `replace: true` drops them all)."""
    raw, lines = _read(PRICES_FILE, "offers")
    offers = {o.key: o for o in _offers(raw, PRICES_FILE, lines)}
    rates = _rates(raw, PRICES_FILE)
    as_of, sources = str(raw.get("as_of", "?")), [f"{PRICES_FILE.name} (as of {raw.get('as_of', '?')})"]
    if extra is not None:
        user, user_lines = _read(extra, "offers")
        if user.get("replace"):
            offers = {}
        offers.update({o.key: o for o in _offers(user, extra, user_lines)})
        rates.update(_rates(user, extra))
        as_of = str(user.get("as_of", as_of))
        sources.append(f"{extra} (as of {user.get('as_of', '?')})")
    prices = PriceList(as_of=as_of, offers=tuple(offers.values()), exchange_rates_usd=rates,
                       sources=tuple(sources))
    if gpus is not None:
        known = {g.name for g in gpus}
        for offer in prices.offers:
            if offer.gpu not in known:
                raise ConfigError(f"prices: offer {offer.provider} {offer.instance}: unknown card {offer.gpu!r}."
                                  f"{_close(offer.gpu, known)}")
    missing = {o.currency for o in prices.offers} - set(rates)
    if missing:
        raise ConfigError(f"prices: no exchange rate for {', '.join(sorted(missing))}; add it under "
                          "exchange_rates_usd in your prices file or pass --rate CODE=USD_VALUE.")
    return prices


def prices_in(currency: str, prices_file: Path | None = None,
              rates: dict[str, float] | None = None) -> tuple[PriceList, str]:
    """The price list (the packaged one, extended by `prices_file`) with the user's exchange rates, and the
    currency to show, refused when no rate converts to it."""
    prices = load_prices(prices_file, load_gpus())
    rates = {**prices.exchange_rates_usd, **(rates or {})}
    code = currency.upper()
    if code not in rates:
        raise ConfigError(f"--currency {currency!r}: no exchange rate for it; known: {', '.join(sorted(rates))}. "
                          f"Add one with --rate {code}=USD_VALUE.")
    return prices.model_copy(update={"exchange_rates_usd": rates}), code


def find_gpus(gpus: tuple[Gpu, ...], names: list[str]) -> tuple[Gpu, ...]:
    """The cards the user named, case, spacing and dashes ignored. A name that is exactly a card picks it;
    otherwise every card it starts (`A100` → A100 40GB and A100 80GB, `H100` → PCIe and SXM) or an alias
    names (`H100-SXM5`, `4090`). An unknown name lists the known ones."""
    chosen: list[Gpu] = []
    for name in names:
        matches = _matching(gpus, name)
        if not matches:
            raise ConfigError(f"--gpu {name!r}: unknown card.{_close(name, [g.name for g in gpus])} "
                              f"Known cards: {', '.join(g.name for g in gpus)}.")
        chosen += [g for g in matches if g not in chosen]
    return tuple(chosen)


def device_card(device_name: str, gpus: tuple[Gpu, ...]) -> Gpu | None:
    """The catalog entry for a name such as 'NVIDIA H100 80GB HBM3' (longest catalog name it contains)."""
    name = _key(device_name)
    matches = [g for g in gpus if _key(g.name) in name or name in _key(g.name)]
    if not matches:
        stem = [g for g in gpus if _key(g.name).split("gb")[0][:4] == name[:4]]
        matches = stem
    return max(matches, key=lambda g: len(g.name), default=None)


# Names people type for a card that are neither its catalog name nor a prefix of it (keys as `_key` makes).
_ALIASES = {"h100sxm5": "H100 SXM", "h100nvlink": "H100 SXM", "h200sxm": "H200", "b200sxm": "B200",
            "a10g24gb": "A10G", "tesla4": "T4", "teslat4": "T4"}


def _matching(gpus: tuple[Gpu, ...], name: str) -> list[Gpu]:
    key = _key(name)
    if not key:
        return []
    exact = [g for g in gpus if _key(g.name) == key]
    if exact:
        return exact
    alias = _ALIASES.get(key)
    if alias is not None:
        return [g for g in gpus if g.name == alias]
    # a prefix of the name, with or without its family (`4090` for RTX 4090)
    found = [g for g in gpus if _key(g.name).startswith(key) or _key(g.name).removeprefix("rtx").startswith(key)
             and key[0].isdigit()]
    sized = re.fullmatch(r"\s*(.+?)[\s_-]+(\d+)\s*gb\s*", name.lower())
    if found or not sized:
        return found
    # a family with the memory on the box (`H100-80GB`, `L40S-48GB`, `H200-141GB`): its cards of about that size
    family, size = _matching(gpus, sized.group(1)), int(sized.group(2))
    return [g for g in family if abs(g.memory_gib - size) <= 0.08 * size]


def parse_rates(items: list[str]) -> dict[str, float]:
    """`CNY=0.14` (USD per unit) → {"CNY": 0.14}."""
    rates = {}
    for item in items:
        code, _, value = item.partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if len(code.strip()) != 3 or rate <= 0:
            raise ConfigError(f"--rate {item!r}: write it as CODE=USD_VALUE, e.g. --rate CNY=0.139 "
                              "(one yuan is worth 0.139 US dollars).")
        rates[code.strip().upper()] = rate
    return rates


def _key(name: str) -> str:
    return "".join(name.lower().replace("nvidia", "").replace("geforce", "").split()).replace("-", "")


def _close(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.4)
    return f" Did you mean {close[0]!r}?" if close else ""


def _read(path: Path, list_key: str) -> tuple[dict, list[int]]:
    """The YAML mapping and, for each item of its `list_key` list, the line it starts on."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file.")
    text = path.read_text()
    try:
        raw = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get(list_key), list):
        raise ConfigError(f"{path}: expected a mapping with a `{list_key}:` list "
                          f"(see {PLAN_DIR / (list_key == 'gpus' and 'gpus.yaml' or 'prices.yaml')}).")
    lines = []
    for key_node, value_node in node.value:
        if key_node.value == list_key:
            lines = [item.start_mark.line + 1 for item in value_node.value]
    return raw, lines


def _validate(model: type[BaseModel], item: Any, path: Path, list_key: str, index: int, lines: list[int]):
    try:
        return model.model_validate(item)
    except ValidationError as e:
        line = lines[index] if index < len(lines) else "?"
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(row)'}: {err['msg']}"
                             for err in e.errors())
        raise ConfigError(f"{path}, line {line} ({list_key}[{index}]): {problems}.") from None


def _offers(raw: dict, path: Path, lines: list[int]) -> list[Offer]:
    return [_validate(Offer, item, path, "offers", index, lines) for index, item in enumerate(raw["offers"])]


def _rates(raw: dict, path: Path) -> dict[str, float]:
    rates = raw.get("exchange_rates_usd", {}) or {}
    if not isinstance(rates, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in rates.values()):
        raise ConfigError(f"{path}: exchange_rates_usd must map currency codes to positive USD values, "
                          "e.g. {USD: 1.0, CNY: 0.139}.")
    return {str(k).upper(): float(v) for k, v in rates.items()}

"""Why a job compiled a program instead of loading it: one named cause per miss, what differs, and the fix."""

from jaxcache.explain.causes import CAUSES
from jaxcache.explain.engine import explain
from jaxcache.explain.model import Deletion, EntryNow, Explanation, History, Known, Miss, PartDiff

__all__ = ["CAUSES", "Deletion", "EntryNow", "Explanation", "History", "Known", "Miss", "PartDiff", "explain"]

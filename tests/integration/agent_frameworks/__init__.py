"""One small agent per agent framework, each an `async def agent(task, base_url) -> float` as horizonrl's
gateway trains it (`task.agent: "integration.agent_frameworks.<module>:agent"`), solving the arithmetic task
(horizonrl.tasks.arithmetic) with one calculator tool, written the way that framework's docs write agents and
with its defaults. test_agent_frameworks.py runs them against a gateway and trains them."""
